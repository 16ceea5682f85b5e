"""`ttmirror fuzz --seconds` bounds the whole run: the Hypothesis phase stops at the deadline
between two moves, while generating or while shrinking, and a failure found before the deadline
is still reported with a trace that replays it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ttmirror.cli import main
from ttmirror.conformance.bugs import BUG_VARIABLE
from ttmirror.conformance.campaigns import campaign, profiles
from ttmirror.conformance.lockstep import machine
from ttmirror.conformance.lockstep.harness import Lockstep
from ttmirror.model.state import RING


def _expire_at_the_first_smaller_failure(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the deadline pass the moment a shrink of the first failure still fails: the clock
    no test can rely on, replaced by the event the deadline is about (deterministic)."""
    finished = machine.Recorder.finished
    failures: list[int] = []  # each failing run's failing move, in the order they ran

    def finish_then_expire(self: machine.Recorder, ls: Lockstep) -> None:
        finished(self, ls)
        if ls.failure is not None:
            failures.append(ls.failure.step)
            if failures[-1] < failures[0]:
                self.deadline = 0.0

    monkeypatch.setattr(machine.Recorder, "finished", finish_then_expire)
    return failures


def test_a_passed_deadline_stops_generation_at_once() -> None:
    start = time.perf_counter()
    result = campaign.run(RING._replace(requests=1), "tt", profiles.profile("ci"), seed=0,
                          deadline=start)
    assert result.out_of_time and not result.failed
    assert result.examples == 1  # the first move of the first example saw the deadline
    assert result.steps <= 2


def test_hypothesis_shrinks_and_the_deadline_keeps_the_smallest_failure_so_far(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failures = _expire_at_the_first_smaller_failure(monkeypatch)
    bug = "stale-host-id-on-resume"  # first found in a long run, so there is much to shrink
    result = campaign.run(RING, "tt", profiles.profile("ci"), seed=0, bug=bug,
                          trace_dir=tmp_path, deadline=time.perf_counter() + 600)
    assert result.out_of_time and result.failed and result.error, failures
    # Hypothesis shrank (a failure it cannot trace back to its origin, it does not shrink), and
    # the report is the last failing run: the smallest so far.
    assert result.trace_len == failures[-1] + 1 and failures[-1] == min(failures) < failures[0]
    assert result.trace_path is not None and result.trace_path.exists()
    # The trace replays the failure it reports (1), and conforms without the bug (0).
    assert main(["replay", str(result.trace_path), "--bug", bug]) == 1
    assert main(["replay", str(result.trace_path)]) == 0


def test_fuzz_reports_the_smallest_failure_when_the_deadline_cuts_its_shrinking(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The deadline is made to pass during shrinking (not by the clock): the command reports the
    # smallest failure found by then, with its trace, and says the shrinking was cut.
    failures = _expire_at_the_first_smaller_failure(monkeypatch)
    # Found at seed 0 in a run of some twenty moves, then shrunk: seconds here, where
    # stale-host-id-on-resume first sends the fuzz through minutes of Hypothesis's target
    # optimisation.
    monkeypatch.setenv(BUG_VARIABLE, "deliver-dropped")
    code = main(["fuzz", "--seconds", "1800", "--jobs", "1", "--traces", str(tmp_path),
                 "--json"])
    out = capsys.readouterr()
    assert code == 1 and failures and min(failures) < failures[0]
    report = json.loads(out.out)
    assert report["stopped"] == "failure" and report["failure"].startswith("step ")
    assert Path(report["trace"]).exists()
    assert "--seconds ran out while Hypothesis shrank a failure" in out.err


def test_fuzz_seconds_bounds_the_whole_run_and_says_how_it_stopped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # On the real clock: unbounded, this bug's shrinking alone runs some 2,000 examples
    # (minutes). Whatever the machine's speed, --seconds 20 ends the run within its budget plus
    # one last move and the trace, and the report says honestly where the time ran out: while
    # exploring, while shrinking a failure it had found (with that failure's trace), or before
    # finding one.
    start = time.perf_counter()
    monkeypatch.setenv(BUG_VARIABLE, "stale-host-id-on-resume")
    code = main(["fuzz", "--seconds", "20", "--jobs", "1", "--traces", str(tmp_path), "--json"])
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    assert code == 1 and elapsed < 20 + 15, elapsed
    if not out.out:  # a machine slow enough to spend all 20 s exploring: one line, no report
        assert "--seconds 20 ran out while exploring the model" in out.err, out.err
        return
    report = json.loads(out.out)
    assert report["stopped"] in ("failure", "seconds"), report["stopped"]
    if report["stopped"] == "failure":
        assert report["failure"].startswith("step ") and Path(report["trace"]).exists()
        assert "--seconds ran out while Hypothesis shrank a failure" in out.err
    else:
        assert report["failure"] is None and report["trace"] is None
        assert "--seconds ran out during the Hypothesis phase" in out.err


def test_fuzz_seconds_running_out_while_exploring_exits_1_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --seconds 0 is spent before the first progress report of the exploration: the run did
    # what it was told (not a usage error, 2) and covered nothing (1).
    code = main(["fuzz", "--seconds", "0", "--jobs", "1", "--traces", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("ttmirror: --seconds 0 ran out while exploring")
    assert "Traceback" not in err[0]

"""Every planted bug is killed, and its shrunk regression trace fails with the bug and passes
without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttmirror.conformance import itf, mutants, profiles
from ttmirror.conformance.replay import CONFORMS, FAILS, replay
from ttmirror.impl import faults
from ttmirror.model.explore import Exploration
from ttmirror.model.state import Bounds

REGRESSIONS = Path(__file__).parent.parent / "regressions"


def test_catalog_has_at_least_eight_bugs_and_a_trace_each() -> None:
    assert len(faults.BUGS) >= 8
    assert {p.name.removesuffix(".itf.json") for p in REGRESSIONS.glob("*.itf.json")} == set(
        faults.BUGS
    )


@pytest.mark.parametrize("bug", sorted(faults.BUGS))
def test_regression_trace_fails_with_its_bug_and_passes_without(bug: str) -> None:
    trace = itf.load(REGRESSIONS / f"{bug}.itf.json")
    assert trace.meta["bug"] == bug
    with faults.planted(bug):
        on = replay(trace.bounds, trace.backend, trace.prompts, trace.moves, trace.states[1:])
    off = replay(trace.bounds, trace.backend, trace.prompts, trace.moves, trace.states[1:])
    assert on.status == FAILS, on.reason
    assert off.status == CONFORMS, off.rows[-1:]


@pytest.mark.parametrize("bug", sorted(faults.BUGS))
def test_suite_kills_bug(bug: str, default_run: Exploration, tmp_path: Path) -> None:
    kill = mutants.kill(bug, Bounds(), "tt", profiles.profile("ci"), walk_seconds=60,
                        trace_dir=tmp_path, explored=lambda: default_run)
    assert kill.killed, kill
    assert kill.trace is not None and kill.trace_len is not None and kill.trace_len <= 40
    with faults.planted(bug):
        again = replay(Bounds(), "tt", itf.load(Path(kill.trace)).prompts,
                       itf.load(Path(kill.trace)).moves)
    assert again.status == FAILS


def test_bugs_are_inert_when_off() -> None:
    assert faults.current() is None
    with faults.planted("guard-off"):
        assert faults.active("guard-off") and not faults.active("deliver-dropped")
    assert faults.current() is None
    with pytest.raises(ValueError, match="unknown planted bug"), faults.planted("no-such-bug"):
        pass

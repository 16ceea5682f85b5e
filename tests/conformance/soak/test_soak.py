"""The soak's CI version (`make soak` runs 100,000 steps): the command line, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _soak(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror.cli", "soak", "--json", *args],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "LOGURU_LEVEL": "WARNING"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("args", [("--steps", "2000", "--seed", "0"),
                                  ("--steps", "400", "--seed", "1", "--traced",
                                   "--fault-rate", "0.05", "--logprobs", "0"),
                                  ("--steps", "400", "--seed", "2", "--clock", "threaded",
                                   "--fault-rate", "0.05")],
                         ids=["eager-2000", "traced-400", "threaded-400"])
def test_the_soak_loses_nothing_under_faults(args: tuple[str, ...]) -> None:
    r = _soak(*args)
    steps = int(args[1])
    assert r["steps"] >= steps  # type: ignore[operator]
    assert (r["hazards"], r["lost_tokens"], r["duplicated_tokens"], r["wrong_logprobs"],
            r["leaked_buffers"]) == (0, 0, 0, 0, 0)
    # The logprob ring is on by default: its entries were checked, token by token; off, none.
    if "--logprobs" in args:
        assert r["logprob_tokens"] == 0
    else:
        assert r["logprob_tokens"] == r["tokens"] > 0  # type: ignore[operator]
    assert r["validated"] is True and r["divergence"] is None
    # It really was a soak under faults: faults met in several phases failed requests, and the
    # loop preempted, aborted and served many requests meanwhile.
    phases = r["faults_by_phase"]
    assert isinstance(phases, dict) and len(phases) >= 3, phases
    assert r["faults"] >= 5 and r["failed_requests"] > 0  # type: ignore[operator]
    assert r["preemptions"] > 0 and r["aborts"] > 0  # type: ignore[operator]
    assert r["requests"] > steps // 3  # type: ignore[operator]
    if "--traced" in args:
        assert r["injected"] >= r["faults"]  # type: ignore[operator]



def _replayed(seed: int, trace: Path) -> dict[str, object]:
    """The default deadline (1 s): a wait that is not held back finishes in milliseconds, so
    only a late read times out, however busy the machine."""
    return _soak("--steps", "300", "--seed", str(seed), "--fault-rate", "0.05",
                 "--trace", str(trace))


def test_a_seed_replays_the_soak_exactly(tmp_path: Path) -> None:
    """On the simulated clock (the default) two runs of one seed are one run: the same report
    (faults by call and phase, tokens, the device's completion order), the same delivered tokens
    and the same event trace, byte for byte."""
    a, b = (_replayed(4, tmp_path / f"run{i}.itf.json") for i in range(2))
    assert a["clock"] == "simulated"
    assert [k for k in a if a[k] != b[k] and k not in WALL_CLOCK_FIELDS] == []
    assert (tmp_path / "run0.itf.json").read_bytes() == (tmp_path / "run1.itf.json").read_bytes()
    # A run worth replaying: late reads the host gave up on, faults met in several phases.
    injected, phases = a["injected_by_call"], a["faults_by_phase"]
    assert isinstance(injected, dict) and isinstance(phases, dict)
    assert injected.get("stall", 0) > 0 and phases.get("readback_complete", 0) > 0
    assert len(phases) >= 3 and a["hazards"] == 0 and a["validated"] is True
    # The digests tell runs apart: another seed, another completion order and other tokens.
    c = _replayed(5, tmp_path / "other.itf.json")
    assert c["device_order"] != a["device_order"] and c["delivered"] != a["delivered"]


def test_the_soak_in_a_device_process_is_the_soak_in_the_hosts(tmp_path: Path) -> None:
    """`--device process` on the simulated clock: the device process runs each command when the
    clock completes it, so one seed gives the host-process run's report, completion order,
    delivered tokens and event trace, byte for byte."""
    there = _soak("--steps", "300", "--seed", "4", "--fault-rate", "0.05", "--device", "process",
                  "--trace", str(tmp_path / "there.itf.json"))
    here = _replayed(4, tmp_path / "here.itf.json")
    assert there["device"] == "process" and here["device"] == "host"
    assert [k for k in here if here[k] != there[k]
            and k not in (*WALL_CLOCK_FIELDS, "device")] == []
    assert (tmp_path / "there.itf.json").read_bytes() == (tmp_path / "here.itf.json").read_bytes()
    assert there["injected"] and there["faults"] and there["validated"] is True


WALL_CLOCK_FIELDS = ("seconds", "peak_rss_mb", "trace_file")
"""What a replay may change: how long it took, its memory, where its trace went."""

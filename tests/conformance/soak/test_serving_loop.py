"""The serving loop's state machine: every run validates against the model and equals depth 1.

Runs in the ci profile (derandomized, sized for CI); `make fuzz-long` runs it under HypoFuzz.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, settings

from ttmirror.conformance.campaigns.profiles import serving_settings
from ttmirror.conformance.soak.serving_loop import FAILURE, TRACE_DIR, ServingLoop, Tally
from ttmirror.conformance.traces.itf import read_events
from ttmirror.conformance.traces.validate import bounds_of, validate


def test_every_serving_run_validates_and_equals_depth_1() -> None:
    ServingLoop.tally = tally = Tally()
    test = ServingLoop.TestCase
    test.settings = serving_settings()
    test("runTest").runTest()
    # Non-vacuous: the campaign's runs really overlapped steps, read ids from the mirror,
    # preempted and aborted requests with steps in flight, stopped early, chunked prefills,
    # mixed sampling parameters in one step, and met device faults that failed requests.
    seen = tally.seen
    assert tally.runs >= serving_settings().max_examples // 2, tally
    for what in ("overlapped_launches", "mirror_rows", "kv_preemptions", "preempt_in_flight",
                 "abort_in_flight", "finish_in_flight", "partial_rows", "kv_mixed_sampling_steps",
                 "stopped", "faults", "failed_requests"):
        assert seen[what] > 0, f"no run had {what}: {dict(seen)}"


def test_twin_the_machine_finds_a_slot_released_early(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With `release-when-draining` planted (the tokens still agree), a run leaves the model, and
    the trace it writes diverges under `ttmirror validate` too (no shrinking: CI time)."""
    monkeypatch.setenv(TRACE_DIR, str(tmp_path))
    ServingLoop.tally = Tally()
    test = ServingLoop.TestCase
    test.settings = settings(serving_settings(), phases=[Phase.generate])
    monkeypatch.setattr(ServingLoop, "bug", "release-when-draining")
    with pytest.raises(
            AssertionError, match=r"release\(\d+,\)\): not enabled"):
        test("runTest").runTest()
    events = list(read_events(tmp_path / FAILURE))
    d = validate(events, bounds_of(events))
    assert d is not None and d.event.action == "release"

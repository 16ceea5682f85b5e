"""The runner's count of vLLM's scheduler freedoms (spec rule 14), step by step: a request left
out of a step (and whether its own step was in flight then), a row carrying fewer drafts than it
has, and a row with none of its drafts beside one with all K. The counts are what the vLLM
battery reads to say a freedom really occurred, so each is checked here against a schedule that
makes it happen exactly once, and against one that makes none."""

from __future__ import annotations

import pytest

from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.drafts import DraftSpec
from ttmirror.impl.runner import PhaseError, Runner, RunnerConfig

from .phases import retire_oldest

FREEDOMS = ("skipped_rows", "skipped_in_flight", "fewer_drafts", "none_beside_all")


def _runner(k: int = 2) -> Runner:
    runner = Runner(CpuBackend(), RunnerConfig(depth=2, slots=2, rows=4, max_tokens=8,
                                               drafts=DraftSpec(k=k), subsets=True))
    runner.allocate()
    return runner


def _step(runner: Runner, order: tuple[int, ...], drafts: tuple[int, ...] | None = None) -> None:
    q = runner.schedule(order, drafts)
    runner.combine(q)
    runner.launch(q)


def _counts(runner: Runner) -> dict[str, int]:
    return {name: runner.stats[name] for name in FREEDOMS}


def test_every_request_with_all_its_drafts_counts_no_freedom() -> None:
    runner = _runner()
    runner.arrive(0, 3)
    runner.arrive(1, 5)
    _step(runner, (0, 1))  # prefills: no drafts yet
    _step(runner, (0, 1), (2, 2))
    retire_oldest(runner)
    _step(runner, (1, 0), (2, 2))
    assert _counts(runner) == dict.fromkeys(FREEDOMS, 0)


def test_a_request_left_out_with_its_step_in_flight_is_counted_once() -> None:
    runner = _runner()
    runner.arrive(0, 3)
    runner.arrive(1, 5)
    _step(runner, (0, 1))
    _step(runner, (1,))  # request 0 left out while step 0, which holds it, is in flight
    assert _counts(runner) == {"skipped_rows": 1, "skipped_in_flight": 1, "fewer_drafts": 0,
                               "none_beside_all": 0}
    retire_oldest(runner)
    retire_oldest(runner)
    _step(runner, (1,), (2,))  # left out again, nothing of it in flight now
    assert _counts(runner)["skipped_rows"] == 2 and _counts(runner)["skipped_in_flight"] == 1


def test_fewer_drafts_and_none_beside_all_are_counted_per_row_and_per_step() -> None:
    runner = _runner()
    runner.arrive(0, 3)
    runner.arrive(1, 5)
    _step(runner, (0, 1))
    _step(runner, (0, 1), (1, 2))  # row 0 carries one of its two drafts
    assert _counts(runner) == {"skipped_rows": 0, "skipped_in_flight": 0, "fewer_drafts": 1,
                               "none_beside_all": 0}
    retire_oldest(runner)
    _step(runner, (0, 1), (0, 2))  # none of row 0's beside all of row 1's
    assert _counts(runner) == {"skipped_rows": 0, "skipped_in_flight": 0, "fewer_drafts": 2,
                               "none_beside_all": 1}


def test_a_row_may_not_carry_more_drafts_than_it_has() -> None:
    runner = _runner()
    runner.arrive(0, 3)
    _step(runner, (0,))
    with pytest.raises(PhaseError, match="carries 3 draft"):
        runner.schedule((0,), (3,))
    assert _counts(runner) == dict.fromkeys(FREEDOMS, 0)  # a refused schedule counts nothing

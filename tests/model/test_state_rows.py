"""Per-request state rows (spec rule 14) and vLLM's scheduler freedoms in the model: steps that
hold a subset of the requests, rows with fewer drafts, requests absent from the batch after their
own (pipeline batches), state rows allocated, scattered into, gathered from and released."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ttmirror.model import actions as A
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import invariants_for
from ttmirror.model.state import (
    GARBAGE,
    PLACEHOLDER,
    RING,
    ROWS_VARIANTS,
    VARIANTS,
    Bounds,
    State,
    Status,
    initial_state,
    validate_bounds,
)
from ttmirror.report import check as report

Explored = Callable[[Bounds], Exploration]

ROWS = RING._replace(state="rows")
SUBSETS = RING._replace(state="rows", subsets=True)
PIPELINE = RING._replace(state="rows", subsets=True, depth=3, slots=3, abort=False,
                         preempt=False, finish=False)
DRAFTS = RING._replace(state="rows", subsets=True, spec_tokens=2, max_tokens=3)


def run(*steps: tuple, b: Bounds) -> State:
    """Take the actions in order (as `take` names them, a schedule's drafts after ``"+"``) from
    the initial state; each must be enabled."""
    s = initial_state(b)
    for name, *args in steps:
        drafts: tuple[int, ...] = ()
        if "+" in args:
            at = args.index("+")
            args, drafts = args[:at], tuple(args[at + 1:])
        t = A.take(s, b, A.Action(name, tuple(args), drafts))
        assert t is not None, f"{name}{tuple(args)} not enabled at {s}"
        s = t
    return s


def broken(s: State, b: Bounds) -> set[str]:
    return {inv.name for inv in invariants_for(b) if not inv.holds(s, b)}


BOTH = (("allocate",), ("arrive", 0), ("arrive", 1))


def test_arrival_takes_the_lowest_free_state_row_and_waits_when_none_is_free() -> None:
    b = RING._replace(state="rows", state_rows=1, abort=True)
    s = run(("allocate",), ("arrive", 1), b=b)
    assert s.requests[1].state_row == 0 and s.table[0].owner == 1
    assert A.arrive(s, b, 0) is None  # no free row: it waits, as max_num_seqs holds it back
    s = run(("allocate",), ("arrive", 1), ("abort", 1), ("release_row", 0), ("arrive", 0), b=b)
    assert (s.requests[0].state_row, s.table[0].owner, s.requests[1].state_row) == (0, 0, -1)


def test_a_state_row_is_released_only_once_no_step_of_its_closed_owner_is_in_flight() -> None:
    b = RING._replace(state="rows", requests=1)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("abort", 0), b=b)
    assert A.release_row(s, b, 0) is None  # its dropped row still scatters into it
    assert s.queue[0].rows[0].live is False and s.queue[0].rows[0].idx == 0
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("abort", 0), ("combine", 0),
            ("launch", 0), ("readback_issue", 0), ("readback_complete", 0), ("apply",), b=b)
    assert A.release_row(s, b, 0) is not None
    running = run(("allocate",), ("arrive", 0), b=b)
    assert A.release_row(running, b, 0) is None  # its owner is still active


def test_the_known_bad_release_lets_a_launch_scatter_into_a_released_row() -> None:
    b = RING._replace(state="rows", requests=1, variant="state-row-reused-in-flight")
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("abort", 0),
            ("release_row", 0), b=b)
    assert broken(s, b) == set()
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("abort", 0),
            ("release_row", 0), ("launch", 0), b=b)
    assert broken(s, b) == {"NoWriteToUnheldStateRow"}


def test_a_launch_scatters_each_rows_newest_token_into_its_state_row() -> None:
    s = run(*BOTH, ("schedule", 1, 0), ("combine", 0), ("launch", 0), b=ROWS)
    assert [row.idx for row in s.queue[0].rows] == [1, 0]
    assert [entry.newest for entry in s.table] == [(0, 1), (1, 1)]


def test_without_subsets_a_step_holds_every_eligible_request() -> None:
    s = run(*BOTH, b=ROWS)
    assert A.schedule(s, ROWS, (0,)) is None
    assert A.schedule(s, SUBSETS, (0,)) is not None
    assert A.schedule(s, SUBSETS, (0, 0)) is None  # a request has one row per step
    assert A.schedule(s, SUBSETS, ()) is None


def test_a_request_left_out_of_the_step_after_its_own_combines_from_its_state_row() -> None:
    """Pipeline batches: r0 in q0, absent from q1, in q2 while q0 is still in flight. Its newest
    token is in q0's output, two steps back: the state row holds it, the ring's previous-row map
    (and the known-bad lookup in the previous step only) cannot reach it."""
    steps = (*BOTH, ("schedule", 0), ("schedule", 1), ("schedule", 0), ("combine", 0),
             ("launch", 0), ("combine", 1), ("launch", 1), ("combine", 2))
    s = run(*steps, b=PIPELINE)
    row = s.queue[2].rows[0]
    assert (row.prev_row, row.consumed, row.pos) == (0, (0, 1), 1)
    assert broken(s, PIPELINE) == set()
    ring = PIPELINE._replace(state="ring")
    s = run(*steps, b=ring)
    assert s.queue[2].rows[0].consumed == PLACEHOLDER
    assert "StaleHostIdsGuard" in broken(s, ring)
    bad = PIPELINE._replace(variant="skipped-from-previous-step")
    s = run(*steps, b=bad)
    assert s.queue[2].rows[0].consumed == PLACEHOLDER
    assert "StaleHostIdsGuard" in broken(s, bad)


def test_the_known_bad_idx_mapping_gathers_another_requests_state_row() -> None:
    b = ROWS._replace(variant="idx-from-previous-order")
    steps = (*BOTH, ("schedule", 0, 1), ("schedule", 1, 0), ("combine", 0), ("launch", 0),
             ("combine", 1))
    s = run(*steps, b=b)
    assert [row.consumed for row in s.queue[1].rows] == [(0, 1), (1, 1)]  # swapped
    assert "StaleHostIdsGuard" in broken(s, b)
    s = run(*steps, b=ROWS)
    assert [row.consumed for row in s.queue[1].rows] == [(1, 1), (0, 1)]
    assert broken(s, ROWS) == set()


def test_each_row_carries_any_number_of_its_drafts() -> None:
    s = run(*BOTH, ("schedule", 0, 1, "+", 0, 0), ("combine", 0), ("launch", 0, 0, 0),
            b=DRAFTS)
    assert all(r.drafts_ready for r in s.requests)
    for d in range(3):
        assert A.schedule(s, DRAFTS, (1, 0), (d, 2 - d)) is not None
    assert A.schedule(s, DRAFTS, (1, 0), (3, 0)) is None  # more than the drafter proposed
    # None said: all each row has, as the implementation's default.
    assert A.schedule(s, DRAFTS, (1, 0)) == A.schedule(s, DRAFTS, (1, 0), (2, 2))
    t = A.schedule(s, DRAFTS, (1, 0), (0, 2))
    assert t is not None
    assert [(r.req, r.spec) for r in t.queue[1].rows] == [(1, 0), (0, 2)]
    assert t.requests[1].placeholders == 1 + 1 and t.requests[0].placeholders == 1 + 3
    assert A.Action("schedule", (1, 0), (0, 2)).label() == "schedule(r1+0,r0+2)"
    t = A.combine(t, DRAFTS, 1)
    assert t is not None
    assert [len(r.drafts) for r in t.queue[1].rows] == [0, 2]
    assert broken(t, DRAFTS) == set()


def test_the_known_bad_draft_count_of_another_row_feeds_the_wrong_drafts() -> None:
    b = DRAFTS._replace(variant="draft-count-of-another-row")
    s = run(*BOTH, ("schedule", 0, 1, "+", 0, 0), ("combine", 0), ("launch", 0, 0, 0),
            ("schedule", 1, 0, "+", 0, 2), ("combine", 1), b=b)
    assert [len(r.drafts) for r in s.queue[1].rows] == [0, 0]
    assert "StaleHostIdsGuard" in broken(s, b)


def test_a_skipped_request_keeps_its_drafts() -> None:
    steps = (*BOTH, ("schedule", 0, 1, "+", 0, 0), ("combine", 0), ("launch", 0, 0, 0),
             ("schedule", 1, "+", 2))
    s = run(*steps, b=DRAFTS)
    assert s.requests[0].drafts_ready  # its state row still holds them
    # The ring at depth 2: by r0's next step the step it was in has been applied, so its
    # newest token and drafts come from the readback, as a host row's.
    ring = DRAFTS._replace(state="ring")
    s = run(*steps, ("readback_issue", 0), ("readback_complete", 0), ("apply",), b=ring)
    assert s.requests[0].drafts_ready
    t = A.schedule(s, ring, (0,), (2,))
    assert t is not None
    row = t.queue[-1].rows[0]
    assert (row.prev_row, row.placed, row.drafts) == (None, 1, ((0, 2), (0, 3)))


def test_a_dropped_row_scatters_garbage_and_the_request_restarts_from_host_ids() -> None:
    b = RING._replace(state="rows", requests=1, preempt_policy="drop", max_tokens=3)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0),
            ("schedule", 0), ("preempt", 0), ("combine", 1), ("launch", 1), b=b)
    assert s.table[0].newest == GARBAGE and s.requests[0].status == Status.PREEMPTED
    assert broken(s, b) == set()


def test_state_row_bounds_are_checked() -> None:
    for bad, text in ((RING._replace(state="cube"), "--state"),
                      (RING._replace(state_rows=1), "--state-rows needs"),
                      (RING._replace(state="rows", state_rows=3), "--state-rows must"),
                      (RING._replace(depth=5), "--depth"),
                      (RING._replace(spec_tokens=5), "--spec-tokens"),
                      (RING._replace(variant="skipped-from-previous-step", state="rows"),
                       "--depth 3"),
                      (RING._replace(variant="idx-from-previous-order"), "--state rows")):
        with pytest.raises(ValueError, match=text):
            validate_bounds(bad)
    assert set(ROWS_VARIANTS) <= set(VARIANTS)


NEW_CHECKS = {"skipped_with_step_in_flight", "fewer_drafts", "no_drafts_beside_all",
              "absent_after_own", "state_row_reused", "closed_owner_row_written"}


@pytest.mark.parametrize("bounds", [
    SUBSETS,
    RING._replace(state="rows", subsets=True, state_rows=1),
    PIPELINE,
    RING._replace(state="rows", subsets=True, spec_tokens=1, max_tokens=2, abort=False,
                  preempt=False, finish=False),
], ids=["subsets", "one-state-row", "pipeline", "drafts"])
def test_the_freedoms_hold_and_each_new_situation_occurs(bounds: Bounds,
                                                          explored: Explored) -> None:
    ex = explored(bounds)
    assert ex.ok, report.counterexample(ex)
    assert all(ex.sometimes.values()), report.unreached(ex)
    assert NEW_CHECKS & set(ex.sometimes)


def test_every_new_situation_applies_somewhere_above() -> None:
    from ttmirror.model.invariants import SOMETIMES
    bounds = [SUBSETS, RING._replace(state="rows", subsets=True, state_rows=1), PIPELINE,
              RING._replace(state="rows", subsets=True, spec_tokens=1, max_tokens=2, abort=False,
                            preempt=False, finish=False)]
    for check in SOMETIMES:
        if check.name in NEW_CHECKS:
            assert any(check.applies(b) for b in bounds), check.name


def test_the_ring_holds_subsets_at_depth_2(explored: Explored) -> None:
    """At depth 2 a request left out of a step has its newest token on the host by its next
    step (the step it was in has been applied): the ring serves subsets there, not deeper."""
    ex = explored(RING._replace(subsets=True, abort=False, preempt=False, finish=False))
    assert ex.ok
    assert ex.sometimes["skipped_with_step_in_flight"]

"""Speculative decoding in the model (rule 13): drafts, verification and accepted counts on the
device; positions the host never needs; what the guard, the placeholders and the sometimes checks
see with them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ttmirror.model import actions as A
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import INVARIANTS, SOMETIMES
from ttmirror.model.state import (
    PLACEHOLDER,
    REJECTED,
    RING,
    SPEC_VARIANTS,
    Bounds,
    Phase,
    State,
    Status,
    initial_state,
    validate_bounds,
)
from ttmirror.report import check as report

Explored = Callable[[Bounds], Exploration]

K1 = RING._replace(requests=1, max_tokens=3, spec_tokens=1)
SPEC_CHECKS = {"accepted_0", "accepted_1", "accepted_2", "accepted_counts_differ",
               "reentry_beside_device_drafts", "preempt_with_drafts_in_flight"}


def run(*steps: tuple, b: Bounds = K1) -> State:
    """Take the actions in order (as `take` names them) from the initial state; each must be
    enabled."""
    s = initial_state(b)
    for name, *args in steps:
        t = A.take(s, b, A.Action(name, tuple(args)))
        assert t is not None, f"{name}{tuple(args)} not enabled at {s}"
        s = t
    return s


# r0's prefill in q0 (launched: token 1), then a step behind it whose row reads the mirror.
PIPE = (("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
        ("schedule", 0))


def _retire(q: int = 0) -> tuple[tuple, ...]:
    return (("readback_issue", q), ("readback_complete", q), ("apply",))


def test_a_mirror_row_carries_drafts_and_its_position_comes_from_the_device() -> None:
    s = run(*PIPE)
    row = s.queue[1].rows[0]
    # The host scheduled one draft and knows neither the newest token nor its position.
    assert (row.prev_row, row.spec, row.pos, row.placed) == (0, 1, -1, None)
    assert s.requests[0].placeholders == 1 + 2  # 1 for the prefill row, 1 + K for this one
    s = run(*PIPE, ("combine", 1))
    row = s.queue[1].rows[0]
    assert (row.consumed, row.pos, row.placed, row.drafts) == ((0, 1), 1, 1, ((0, 2),))


@pytest.mark.parametrize("a", [0, 1])
def test_verification_yields_a_plus_one_tokens_and_drains_the_placeholders(a: int) -> None:
    s = run(*PIPE, ("combine", 1), ("launch", 1, a))
    slot = s.slots[s.queue[1].slot]
    assert (slot.content, slot.counts, slot.positions) == (((0, 2 + a),), (a + 1,), (2 + a,))
    s = run(*PIPE, ("combine", 1), ("launch", 1, a), *_retire(), *_retire())
    req = s.requests[0]
    assert req.delivered == tuple((0, p) for p in range(1, 3 + a))  # no rejected draft
    assert req.placeholders == 0
    assert req.status == (Status.FINISHED if a == 1 else Status.RUNNING)


def test_a_launch_refuses_a_count_past_its_drafts() -> None:
    s = run(*PIPE, ("combine", 1))
    assert A.launch(s, K1, 1, 2) is None
    assert A.launch(s, K1, 1) is None  # one count per row
    assert [a.args for a, _ in A.successors(s, K1) if a.name == "launch"] == [(1, 0), (1, 1)]
    assert A.Action("launch", (1, 0)).label() == "launch(q=1, a=0)"


def test_the_next_combine_reads_the_position_the_device_advanced() -> None:
    s = run(*PIPE, ("combine", 1), ("launch", 1, 1), *_retire(), ("schedule", 0))
    s = A.combine(s, K1, 1)
    assert s is not None
    row = s.queue[1].rows[0]
    assert (row.consumed, row.pos, row.placed) == ((0, 3), 3, 3)
    bad = K1._replace(variant="positions-advance-by-spec")
    t = run(*PIPE, ("combine", 1), ("launch", 1, 0), *_retire(), ("schedule", 0), ("combine", 1),
            b=bad)
    row = t.queue[1].rows[0]
    assert (row.consumed, row.pos, row.placed) == ((0, 2), 2, 3)  # advanced by 1 + K, not a + 1
    guard = next(i for i in INVARIANTS if i.name == "StaleHostIdsGuard")
    assert not guard.holds(t, bad)


def test_a_rejected_draft_is_never_the_newest_token_but_in_the_known_bad_variant() -> None:
    bad = K1._replace(variant="rejected-draft-newest")
    s = run(*PIPE, ("combine", 1), ("launch", 1, 0), b=bad)
    assert s.slots[s.queue[1].slot].content == (REJECTED,)
    ok = run(*PIPE, ("combine", 1), ("launch", 1, 0))
    assert ok.slots[ok.queue[1].slot].content == ((0, 2),)  # the token the target sampled


def test_sync_rows_take_their_drafts_from_the_readback() -> None:
    sync = K1._replace(depth=1)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
            *_retire(), ("schedule", 0), b=sync)
    row = s.queue[0].rows[0]
    assert (row.prev_row, row.spec, row.placed, row.drafts) == (None, 1, 1, ((0, 2),))


def test_new_resumed_and_prefill_rows_carry_no_drafts() -> None:
    s = run(("allocate",), ("arrive", 0), ("schedule", 0))
    assert s.queue[0].rows[0].spec == 0  # new
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
            *_retire(), ("preempt", 0), ("resume", 0), ("schedule", 0))
    assert s.queue[0].rows[0].spec == 0  # resumed
    chunked = K1._replace(prefill_chunks=2)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("schedule", 0), b=chunked)
    assert [row.spec for step in s.queue for row in step.rows] == [0, 0]  # both prefill chunks
    bad = K1._replace(variant="reentering-drafts-from-device")
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
            *_retire(), ("preempt", 0), ("resume", 0), ("schedule", 0), b=bad)
    assert s.queue[0].rows[0].drafts == (PLACEHOLDER,)  # the device had none to fill in


def test_a_preempted_request_resumes_only_once_it_owes_no_placeholder() -> None:
    s = run(*PIPE, ("combine", 1), ("launch", 1, 1), *_retire(), ("preempt", 0))
    assert s.requests[0].placeholders == 2 and A.resume(s, K1, 0) is None
    s = run(*PIPE, ("combine", 1), ("launch", 1, 1), *_retire(), ("preempt", 0), *_retire())
    assert s.requests[0].status == Status.FINISHED  # its run reached max tokens
    bad = RING._replace(requests=1, max_tokens=4, spec_tokens=1,
                        variant="placeholders-drain-by-one")
    s = run(*PIPE, ("combine", 1), ("launch", 1, 1), *_retire(), *_retire(), b=bad)
    assert s.requests[0].placeholders == 1 and not s.queue  # one owed that nothing will pay
    assert s.requests[0].status == Status.RUNNING


def test_a_request_done_at_its_budget_drops_its_later_rows() -> None:
    b = RING._replace(requests=1, max_tokens=2, spec_tokens=1)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
            *_retire(), ("schedule", 0), ("combine", 0), ("launch", 0, 1), b=b)
    # Delivered 1; in flight a run of 2 that reaches the budget: no third step is scheduled.
    assert A.schedule(s, b, (0,)) is None
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0, 0),
            ("schedule", 0), ("combine", 1), ("launch", 1, 0), *_retire(),
            b=RING._replace(requests=1, max_tokens=3, spec_tokens=1))
    assert len(s.queue) == 1 and s.queue[0].rows[0].live


def test_spec_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="--spec-tokens must be between 0 and 4"):
        validate_bounds(RING._replace(spec_tokens=5))
    for variant in SPEC_VARIANTS:
        with pytest.raises(ValueError, match="needs --spec-tokens 1 or more"):
            validate_bounds(RING._replace(variant=variant))
    with pytest.raises(ValueError, match="needs --preempt or --host-sync"):
        validate_bounds(RING._replace(spec_tokens=1, preempt=False,
                                      variant="reentering-drafts-from-device"))


def test_the_spec_default_bound_holds_and_every_draft_situation_occurs(
        explored: Explored) -> None:
    b = RING._replace(max_tokens=3, spec_tokens=1)
    ex = explored(b)
    assert ex.ok and report.passed(ex), report.unreached(ex)
    assert SPEC_CHECKS - {"accepted_2"} <= set(ex.sometimes)
    assert "accepted_2" not in ex.sometimes  # n/a with one draft
    # Both steps in flight carried drafts, and some row's position came from the device.
    assert any(len(s.queue) == 2 and all(r.spec for st in s.queue for r in st.rows if r.live)
               for s in ex.states)


def test_two_drafts_reach_every_accepted_count(explored: Explored) -> None:
    ex = explored(RING._replace(max_tokens=3, spec_tokens=2, abort=False))
    assert ex.ok and report.passed(ex), report.unreached(ex)
    assert {"accepted_0", "accepted_1", "accepted_2", "accepted_counts_differ"} <= {
        k for k, v in ex.sometimes.items() if v}


def test_a_request_preempted_with_its_drafts_dropped_can_resume(explored: Explored) -> None:
    # Without aborts nothing else closes it: a placeholder count restored after the drop would
    # leave it PREEMPTED forever (the deadlock the TLA+ twin found, 10 steps).
    b = K1._replace(preempt_policy="drop", abort=False)
    ex = explored(b)
    assert ex.deadlocks == [] and ex.cannot_finish == [] and ex.ok
    assert ex.sometimes["preempt_with_drafts_in_flight"] and ex.sometimes["resumed_after_preempt"]
    s = run(*PIPE, ("preempt", 0), b=b)
    assert s.requests[0].placeholders == 0 and all(not r.live for st in s.queue for r in st.rows)
    assert A.resume(s, b, 0) is not None


@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_a_preemption_with_drafts_in_flight_occurs_under_each_policy(
        policy: str, explored: Explored) -> None:
    ex = explored(K1._replace(preempt_policy=policy))
    assert ex.ok and ex.sometimes["preempt_with_drafts_in_flight"]


def test_without_drafts_no_record_carries_any() -> None:
    assert all(c.applies(RING) is False for c in SOMETIMES if c.name in SPEC_CHECKS)
    s = run(("allocate",), ("arrive", 0), ("schedule", 0), ("combine", 0), ("launch", 0),
            b=RING)
    step = s.queue[0]
    assert (step.accepted, step.rows[0].spec, step.rows[0].placed, step.rows[0].drafts) == (
        (), 0, None, ())
    assert (s.slots[0].counts, s.requests[0].placeholders) == ((), 0)
    assert step.phase == Phase.LAUNCHED

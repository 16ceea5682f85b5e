"""Every action's precondition: disabled where it must be, enabled where it may be."""

from __future__ import annotations

from ttmirror.model import actions as A
from ttmirror.model.state import (
    GARBAGE,
    PLACEHOLDER,
    RING,
    Bounds,
    Phase,
    State,
    Status,
    initial_state,
)

B = RING


def run(*steps: tuple, b: Bounds = B) -> State:
    """Apply actions in order from the initial state; each must be enabled."""
    s = initial_state(b)
    for name, *args in steps:
        t = getattr(A, name)(s, b, *args)
        assert t is not None, f"{name}{tuple(args)} not enabled"
        s = t
    return s


LOADED = (("allocate",), ("arrive", 0))
# r0 in step q0 (slot 0), launched; a second step q1 (slot 1) scheduled behind it.
PIPE = (*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("schedule", (0,)))


def test_allocate_only_once_and_before_anything() -> None:
    s = initial_state(B)
    assert A.arrive(s, B, 0) is None
    assert A.schedule(s, B, (0,)) is None
    loaded = A.allocate(s, B)
    assert loaded is not None and loaded.allocated
    assert A.allocate(loaded, B) is None
    assert [a.name for a, _ in A.successors(s, B)] == ["allocate"]


def test_arrive_needs_absent_request() -> None:
    s = run(*LOADED)
    assert s.requests[0].status == Status.WAITING
    assert A.arrive(s, B, 0) is None
    assert A.arrive(s, B, 1) is not None


def test_schedule_preconditions() -> None:
    s = run(("allocate",))
    assert A.schedule(s, B, ()) is None  # nobody eligible
    s = run(*LOADED, ("arrive", 1))
    assert A.schedule(s, B, (0,)) is None  # must take every eligible request
    assert A.schedule(s, B, (1, 0)) is not None  # condense: any order
    fixed = B._replace(condense=False)
    assert A.schedule(s, fixed, (1, 0)) is None
    assert A.schedule(s, fixed, (0, 1)) is not None
    full = run(*PIPE)
    assert len(full.queue) == 2 and A.schedule(full, B, (0,)) is None  # depth bound
    sync = run(*LOADED, ("schedule", (0,)), b=B._replace(depth=1))
    assert A.schedule(sync, B._replace(depth=1), (0,)) is None


def test_schedule_respects_max_tokens_with_placeholders() -> None:
    b = B._replace(max_tokens=1)
    s = run(*LOADED, ("schedule", (0,)), b=b)
    assert A.eligible(s, b) == []  # its only token is in flight: no second step for it


def test_schedule_builds_previous_row_map_under_the_guard() -> None:
    s = run(*PIPE)
    second = s.queue[1]
    assert second.rows[0].prev_row == 0 and second.src_slot == 0 and second.slot == 1
    off = B._replace(guard=False)
    s = run(*PIPE, b=off)
    assert s.queue[1].rows[0].prev_row is None and s.queue[1].src_slot is None


def test_combine_waits_for_previous_launch_and_reads_mirror() -> None:
    s = run(*LOADED, ("schedule", (0,)), ("schedule", (0,)))
    assert A.combine(s, B, 1) is None  # previous step has not written its slot
    s = run(*PIPE)
    t = A.combine(s, B, 1)
    assert t is not None and t.queue[1].rows[0].consumed == (0, 1)
    assert A.combine(t, B, 1) is None  # only once
    assert A.combine(s, B, 5) is None


def test_guard_off_consumes_a_placeholder() -> None:
    off = B._replace(guard=False)
    t = A.combine(run(*PIPE, b=off), off, 1)
    assert t is not None and t.queue[1].rows[0].consumed == PLACEHOLDER


def test_launch_needs_combine_and_writes_the_slot() -> None:
    s = run(*LOADED, ("schedule", (0,)))
    assert A.launch(s, B, 0) is None
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0))
    assert s.slots[0].content == ((0, 1),) and s.queue[0].phase == Phase.LAUNCHED
    assert A.launch(s, B, 0) is None


def test_launch_over_an_unread_slot_is_recorded() -> None:
    b = B._replace(slots=1)
    s = run(*PIPE, ("combine", 1), ("launch", 1), b=b)
    assert A.REWRITE_WITH_READER in s.broken
    fine = run(*PIPE, ("combine", 1), ("launch", 1))
    assert not fine.broken


def test_readback_issue_then_complete() -> None:
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0))
    assert A.readback_issue(s, B, 0) is None
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0))
    assert A.readback_complete(s, B, 0) is None
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0))
    assert A.readback_issue(s, B, 0) is None
    t = A.readback_complete(s, B, 0)
    assert t is not None and t.queue[0].host_copy == ((0, 1),)


def test_apply_retires_oldest_only_after_readback() -> None:
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0))
    assert A.apply(s, B) is None
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0),
            ("readback_complete", 0), ("apply",))
    assert s.queue == () and s.requests[0].delivered == ((0, 1),) and s.requests[0].unchecked


def test_apply_finishes_at_max_tokens() -> None:
    b = B._replace(max_tokens=1)
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0),
            ("readback_complete", 0), ("apply",), b=b)
    assert s.requests[0].status == Status.FINISHED and s.requests[0].closed_at == 1


def test_release_waits_for_both_readers() -> None:
    s = run(*PIPE, ("readback_issue", 0), ("readback_complete", 0), ("apply",))
    assert A.release(s, B, 0) is None  # the next step's combine still reads slot 0
    t = A.release(A.combine(s, B, 0), B, 0)
    assert t is not None and t.slots[0].released
    assert A.release(t, B, 0) is None  # once
    early = run(*PIPE, ("readback_issue", 0))
    assert A.release(early, B, 0) is None
    assert A.release(run(*LOADED), B, 1) is None  # never written


def test_release_at_issue_variant_reads_a_released_slot() -> None:
    b = B._replace(release_at="issue")
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0),
            ("release", 0), ("readback_complete", 0), b=b)
    assert A.READ_RELEASED in s.broken and s.queue[0].host_copy == (GARBAGE,)


def test_finish_only_after_a_delivered_token() -> None:
    s = run(*PIPE)
    assert A.finish(s, B, 0) is None  # nothing delivered yet: a stop is unknown
    s = run(*PIPE, ("readback_issue", 0), ("readback_complete", 0), ("apply",))
    t = A.finish(s, B, 0)
    assert t is not None and t.requests[0].status == Status.FINISHED
    assert not any(row.live for row in t.queue[0].rows)  # its in-flight row is dropped
    assert A.finish(s, B._replace(finish=False), 0) is None


DROP = B._replace(preempt_policy="drop")


def test_abort_preempt_resume_under_drop() -> None:
    s = run(*PIPE, b=DROP)
    t = A.abort(s, DROP, 0)
    assert t is not None and t.requests[0].status == Status.ABORTED
    assert A.abort(t, DROP, 0) is None and A.preempt(t, DROP, 0) is None
    assert A.abort(s, DROP._replace(abort=False), 0) is None
    p = A.preempt(s, DROP, 0)
    assert p is not None and p.requests[0].status == Status.PREEMPTED
    assert not any(row.live for step in p.queue for row in step.rows)
    assert A.preempt(p, DROP, 0) is None and A.resume(s, DROP, 0) is None
    r = A.resume(p, DROP, 0)
    assert r is not None and r.requests[0].status == Status.WAITING
    # Preemptions are bounded per request: once back to running, no second preemption.
    again = run(*PIPE, ("preempt", 0), ("resume", 0), ("readback_issue", 0),
                ("readback_complete", 0), ("apply",), ("combine", 0), ("launch", 0),
                ("schedule", (0,)), b=DROP)
    assert again.requests[0].status == Status.RUNNING and A.preempt(again, DROP, 0) is None
    assert A.preempt(again, DROP._replace(preemptions=2), 0) is not None
    assert A.preempt(s, DROP._replace(preempt=False), 0) is None


def test_resumed_request_restarts_from_host_ids_under_drop() -> None:
    s = run(*PIPE, ("preempt", 0), ("resume", 0), ("readback_issue", 0), ("readback_complete", 0),
            ("apply",), ("combine", 0), ("launch", 0), ("schedule", (0,)), b=DROP)
    row = s.queue[-1].rows[0]
    assert row.prev_row is None and row.pos == 0  # nothing delivered: re-prefill from the prompt


def test_keep_delivers_the_in_flight_token_and_resumes_only_without_placeholders() -> None:
    s = run(*PIPE)  # keep is the default: vLLM's policy
    p = A.preempt(s, B, 0)
    assert p is not None and p.requests[0].status == Status.PREEMPTED
    assert all(row.live for step in p.queue for row in step.rows)  # nothing dropped
    assert A.resume(p, B, 0) is None  # it owns two placeholders
    t = run(*PIPE, ("preempt", 0), ("readback_issue", 0), ("readback_complete", 0), ("apply",))
    assert t.requests[0].delivered == ((0, 1),) and t.requests[0].status == Status.PREEMPTED
    assert A.finish(t, B, 0) is not None  # the delivered token is stop-checked as usual
    assert A.resume(t, B, 0) is None  # q1's row is still owed
    # q1 (scheduled before the preemption) combines from the mirror and delivers too.
    t = run(*PIPE, ("preempt", 0), ("readback_issue", 0), ("readback_complete", 0), ("apply",),
            ("combine", 0), ("launch", 0), ("readback_issue", 0), ("readback_complete", 0),
            ("apply",))
    assert t.requests[0].status == Status.FINISHED and t.requests[0].delivered == ((0, 1), (0, 2))
    long = B._replace(max_tokens=3)
    t = run(*PIPE, ("preempt", 0), ("readback_issue", 0), ("readback_complete", 0), ("apply",),
            ("combine", 0), ("launch", 0), ("readback_issue", 0), ("readback_complete", 0),
            ("apply",), ("resume", 0), ("schedule", (0,)), b=long)
    row = t.queue[-1].rows[0]
    assert row.prev_row is None and row.pos == 2  # resumed: host ids, its tokens all delivered


def test_resume_with_placeholder_reads_it_from_the_host_table() -> None:
    bad = B._replace(variant="resume-with-placeholder")
    s = run(*PIPE[:-1], ("preempt", 0), ("resume", 0), ("schedule", (0,)), ("combine", 1), b=bad)
    assert s.queue[1].rows[0].consumed == PLACEHOLDER and s.queue[1].rows[0].pos == 1


def test_partial_prefill_rows_are_discarded_and_never_mirrored() -> None:
    b = B._replace(prefill_chunks=2)
    s = run(*LOADED, ("schedule", (0,)), ("schedule", (0,)), b=b)
    first, last = s.queue[0].rows[0], s.queue[1].rows[0]
    assert first.partial and first.pos == 0 and not last.partial and last.pos == 0
    assert last.prev_row is None and s.queue[1].src_slot is None  # the partial id is discarded
    assert A.in_flight(s, 0) == 1  # only the last chunk owes a token
    s = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("readback_issue", 0),
            ("readback_complete", 0), ("apply",), b=b)
    assert s.slots[0].content == (GARBAGE,) and s.requests[0].delivered == ()
    bad = b._replace(variant="partial-prefill-feeds-mirror")
    s = run(*LOADED, ("schedule", (0,)), ("schedule", (0,)), ("combine", 0), ("launch", 0),
            ("combine", 1), b=bad)
    assert s.queue[1].rows[0].prev_row == 0 and s.queue[1].rows[0].consumed == GARBAGE


def test_host_sync_request_waits_for_its_step() -> None:
    b = B._replace(host_sync=True)
    s = run(*LOADED, ("arrive", 1), ("schedule", (0, 1)), b=b)
    assert A.eligible(s, b) == [1]  # r0 is held back while its step is in flight
    assert A.schedule(s, b, (0, 1)) is None and A.schedule(s, b, (1,)) is not None
    bad = b._replace(variant="host-sync-unguarded")
    t = run(*LOADED, ("schedule", (0,)), ("combine", 0), ("launch", 0), ("schedule", (0,)),
            ("combine", 1), b=bad)
    assert t.queue[1].rows[0].prev_row is None and t.queue[1].rows[0].consumed == PLACEHOLDER


def test_final_state_requires_everything_closed_and_released() -> None:
    b = B._replace(requests=1, max_tokens=1)
    s = run(("allocate",), ("arrive", 0), ("schedule", (0,)), ("combine", 0), ("launch", 0),
            ("readback_issue", 0), ("readback_complete", 0), ("apply",), b=b)
    assert not A.is_final(s)
    done = A.release(s, b, 0)
    assert done is not None and A.is_final(done)
    assert list(A.successors(done, b)) == []


def test_newest_token_in_newest_step_fails_when_a_request_skips_the_newest_step() -> None:
    from ttmirror.model.invariants import newest_token_in_newest_step

    # Depth 3: r0 in q0, then q1 scheduled over r1 alone (as if r0 had been held back), so r0's
    # newest token sits in q0 while the next step's combine could read only q1's slot.
    b = B._replace(depth=3, slots=3, max_tokens=3)
    s = run(*LOADED, ("arrive", 1), ("schedule", (0, 1)), b=b)
    assert newest_token_in_newest_step(s, b)
    skipped = s._replace(queue=(*s.queue, s.queue[0]._replace(
        slot=1, rows=tuple(r._replace(live=r.req == 1) for r in s.queue[0].rows))))
    assert A.eligible(skipped, b) == [0, 1]
    assert not newest_token_in_newest_step(skipped, b)
    assert newest_token_in_newest_step(skipped, b._replace(guard=False))  # no mirror: no claim
    # Reached the ordinary way, r0 is in every step after its first: the invariant holds.
    s = run(*LOADED, ("arrive", 1), ("schedule", (0, 1)), ("combine", 0), ("launch", 0),
            ("schedule", (1, 0)), b=b)
    assert len(s.queue) == 2 and newest_token_in_newest_step(s, b)

"""Properties of the model: invariants that must hold in every reachable state, and
"sometimes" checks that must be reached at least once so a green run is never vacuous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .actions import (
    READ_RELEASED,
    REWRITE_WITH_READER,
    WRITE_UNHELD_ROW,
    Action,
    budget,
    drafts_scheduled,
    eligible,
    has_step_in_flight,
    in_flight,
    inputs_right,
    is_host_sync,
    mirror_rows,
    newest_on_device,
    yielded,
)
from .state import CLOSED, HOST_SYNC_REQUEST, Bounds, Phase, State, Status, state_row_count

# ---------------------------------------------------------------------------------------------
# Invariants: state predicates.


def stale_host_ids_guard(s: State, b: Bounds) -> bool:
    """#323-class: every combined live row consumed exactly its request's newest token, and with
    drafts its true position and the drafter's proposals after it."""
    return all(
        row.consumed == (row.req, row.pos) and (row.placed is None or inputs_right(row))
        for step in s.queue
        if step.phase >= Phase.COMBINED
        for row in step.rows
        if row.live
    )


def no_read_of_released_or_overwritten_slot(s: State, b: Bounds) -> bool:
    """No combine or readback ever read a slot that was handed back or rewritten under it."""
    return READ_RELEASED not in s.broken


def no_rewrite_while_reader_outstanding(s: State, b: Bounds) -> bool:
    """No launch ever wrote a slot whose readback or next combine was still to happen."""
    return REWRITE_WITH_READER not in s.broken


def depth_bound(s: State, b: Bounds) -> bool:
    """At most D = max_concurrent_batches steps are in flight."""
    return len(s.queue) <= b.depth


def output_integrity(s: State, b: Bounds) -> bool:
    """Per request, the user got tokens 1..n in order, each once, none past its close or max."""
    for r, req in enumerate(s.requests):
        if req.delivered != tuple((r, pos) for pos in range(1, len(req.delivered) + 1)):
            return False
        if len(req.delivered) > budget(b, r):
            return False
        if req.closed_at is not None and len(req.delivered) != req.closed_at:
            return False
        if req.status in CLOSED and req.closed_at is None:
            return False
    return True


def failed_requests_quiet(s: State, b: Bounds) -> bool:
    """A failed request has no live row in flight: nothing more is computed for it or delivered."""
    failed = {r for r, req in enumerate(s.requests) if req.status == Status.FAILED}
    return not any(row.live and row.req in failed for step in s.queue for row in step.rows)


def newest_token_in_newest_step(s: State, b: Bounds) -> bool:
    """A request the next step would combine from the mirror has its newest token in the newest
    in-flight step: the one slot that combine reads, at any depth."""
    if not b.guard or not s.queue or b.subsets:
        return True
    newest = s.queue[-1]
    return all(
        mirror_rows(newest, r, b) or not any(mirror_rows(step, r, b) for step in s.queue)
        for r in eligible(s, b)
        if s.requests[r].status != Status.WAITING and not is_host_sync(b, r)
    )


def no_write_to_unheld_state_row(s: State, b: Bounds) -> bool:
    """No launch ever scattered a row into a state row its request no longer held (released,
    or another's)."""
    return WRITE_UNHELD_ROW not in s.broken


def state_rows_owned(s: State, b: Bounds) -> bool:
    """Each arrived, unreleased request owns exactly the state row it names, and each owned state
    row names its owner."""
    for r, req in enumerate(s.requests):
        active = req.status in (Status.WAITING, Status.RUNNING, Status.PREEMPTED)
        if active and req.state_row < 0:
            return False
        if req.state_row >= 0 and s.table[req.state_row].owner != r:
            return False
    return all(row.owner < 0 or s.requests[row.owner].state_row == i
               for i, row in enumerate(s.table))


def newest_token_in_state_row(s: State, b: Bounds) -> bool:
    """A request whose in-flight steps have all launched holds its newest token in its state row
    (and with drafts its position): what its next combine gathers, however many steps ago it ran."""
    if not b.guard:
        return True
    for r, req in enumerate(s.requests):
        if req.state_row < 0 or req.status in CLOSED or not newest_on_device(s, b, r):
            continue
        steps = [q for q, step in enumerate(s.queue)
                 if any(row.live and row.req == r for row in step.rows)]
        if s.queue[steps[-1]].phase < Phase.LAUNCHED:
            continue
        entry = s.table[req.state_row]
        if b.spec_tokens:
            pos = len(req.delivered) + sum(yielded(s, q, r) for q in steps)
            if entry.newest != (r, pos):
                return False
        elif entry.newest != (r, len(req.delivered) + in_flight(s, r)):
            return False
    return True


class Invariant(NamedTuple):
    name: str
    holds: Callable[[State, Bounds], bool]
    applies: Callable[[Bounds], bool] = lambda b: True


def _ring(b: Bounds) -> bool:
    return b.state == "ring"


def _rows(b: Bounds) -> bool:
    return b.state == "rows"


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("StaleHostIdsGuard", stale_host_ids_guard),
    Invariant(READ_RELEASED, no_read_of_released_or_overwritten_slot),
    Invariant(REWRITE_WITH_READER, no_rewrite_while_reader_outstanding),
    Invariant("DepthBound", depth_bound),
    Invariant("OutputIntegrity", output_integrity),
    Invariant("FailedRequestsQuiet", failed_requests_quiet),
    # The ring's lemma: without subsets the previous step holds every mirrored newest token.
    Invariant("NewestTokenInNewestStep", newest_token_in_newest_step, _ring),
    Invariant(WRITE_UNHELD_ROW, no_write_to_unheld_state_row, _rows),
    Invariant("StateRowsOwned", state_rows_owned, _rows),
    Invariant("NewestTokenInStateRow", newest_token_in_state_row, _rows),
)


def invariants_for(b: Bounds) -> tuple[Invariant, ...]:
    """The invariants that mean something at ``b``: the ring's or the state rows' own, and the
    rest."""
    return tuple(inv for inv in INVARIANTS if inv.applies(b))

GRAPH_PROPERTIES = ("NoDeadlock", "CanAlwaysFinish")
"""Properties of the whole graph, checked by the explorer after the search."""


# ---------------------------------------------------------------------------------------------
# "Sometimes" checks: transition predicates, each applicable only where the bounds allow it.


def combined_from_mirror(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A row was combined from the previous step's slot (the mirror)."""
    return a.name == "combine" and any(r.prev_row is not None for r in s.queue[a.args[0]].rows)


def combined_from_host(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A decode row (past the prompt) was combined from authoritative host ids."""
    return a.name == "combine" and any(
        r.prev_row is None and (r.pos if r.placed is None else r.placed) > 0
        for r in s.queue[a.args[0]].rows
    )


def finish_with_step_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A request finished on a stop token while a later step for it was in flight."""
    return a.name == "finish" and in_flight(s, a.args[0]) > 0


def abort_hits_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """An abort hit a request with a step in flight."""
    return a.name == "abort" and in_flight(s, a.args[0]) > 0


def preempt_hits_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A preemption hit a request with a step in flight."""
    return a.name == "preempt" and in_flight(s, a.args[0]) > 0


def row_moves(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A request sat at different rows in two consecutive steps that both carry it."""
    if a.name != "schedule" or not s.queue:
        return False
    prev_rows = {row.req: i for i, row in enumerate(s.queue[-1].rows) if row.live}
    return any(r in prev_rows and prev_rows[r] != i for i, r in enumerate(a.args))


def slot_reused(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A launch wrote a slot that an earlier step had written."""
    return a.name == "launch" and s.slots[s.queue[a.args[0]].slot].content is not None


def steps_overlap(s: State, a: Action, t: State, b: Bounds) -> bool:
    """Two steps ran on the device at once: both launched, neither applied."""
    return sum(step.phase >= Phase.LAUNCHED for step in t.queue) >= 2


def resumed_after_preempt(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A preempted request was scheduled again and combined from host ids."""
    return a.name == "schedule" and any(
        s.requests[r].status == Status.WAITING and len(s.requests[r].delivered) > 0
        for r in a.args
    )


def preempted_token_delivered(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A preempted request's in-flight token was applied and delivered (keep)."""
    return a.name == "apply" and any(
        row.live and not row.partial and s.requests[row.req].status == Status.PREEMPTED
        for row in s.queue[0].rows
    )


def resume_waited_for_placeholder(s: State, a: Action, t: State, b: Bounds) -> bool:
    """The apply that delivered a preempted request's last placeholder, which its resume
    waited for (keep)."""
    return a.name == "apply" and any(
        row.live and not row.partial and s.requests[row.req].status == Status.PREEMPTED
        and in_flight(t, row.req) == 0 and t.requests[row.req].status == Status.PREEMPTED
        for row in s.queue[0].rows
    )


def partial_prefill_beside_mirror(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A step combined a partial-prefill row beside a row that reads the mirror."""
    if a.name != "combine":
        return False
    rows = [row for row in s.queue[a.args[0]].rows if row.live]
    return any(r.partial for r in rows) and any(r.prev_row is not None for r in rows)


def host_sync_skipped(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A step was scheduled without the host-sync request, held back by its step in flight."""
    r = HOST_SYNC_REQUEST
    req = s.requests[r] if r < len(s.requests) else None
    return (
        a.name == "schedule" and req is not None and r not in a.args
        and req.status in (Status.WAITING, Status.RUNNING) and has_step_in_flight(s, r)
    )


def fault_spares_bystander(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A fault hit a step while the other in-flight step held a live row of a request that was
    not in the failed step (that request goes on)."""
    if a.name != "fault":
        return False
    hit = {row.req for row in s.queue[a.args[0]].rows if row.live}
    return any(row.live and row.req not in hit
               for q, step in enumerate(s.queue) if q != a.args[0] for row in step.rows)


def fault_after_launch(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A fault hit a step whose launch had written its slot (the slot must still go back)."""
    return a.name == "fault" and s.queue[a.args[0]].phase >= Phase.LAUNCHED


def mirror_read_three_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A step combined from the mirror with three steps in flight (depth 3)."""
    return (a.name == "combine" and len(s.queue) >= 3
            and any(r.prev_row is not None for r in s.queue[a.args[0]].rows))


def _verdicts(s: State, a: Action) -> list[int]:
    """A launch's accepted counts of its rows that carried drafts (none without drafts)."""
    if a.name != "launch" or len(a.args) == 1:
        return []
    rows = s.queue[a.args[0]].rows
    return [n for row, n in zip(rows, a.args[1:], strict=True) if row.live and row.spec > 0]


def accepted(n: int) -> Callable[[State, Action, State, Bounds], bool]:
    """The check that a launch's verification accepted n drafts of some row."""
    def reached(s: State, a: Action, t: State, b: Bounds) -> bool:
        return n in _verdicts(s, a)
    reached.__doc__ = f"A launch's verification accepted {n} draft(s) of a row."
    return reached


def drafts_at_least(n: int) -> Callable[[Bounds], bool]:
    """Where a check of n accepted drafts applies: n drafts scheduled, and a decoding row."""
    def applies(b: Bounds) -> bool:
        return b.spec_tokens >= n and b.max_tokens >= 2
    return applies


def accepted_counts_differ(s: State, a: Action, t: State, b: Bounds) -> bool:
    """Two rows of one launch accepted different numbers of drafts."""
    return len(set(_verdicts(s, a))) >= 2


def reentry_beside_device_drafts(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A step combined a re-entering row past its prompt without drafts beside a row whose
    newest token and drafts came from the device."""
    if a.name != "combine":
        return False
    rows = [row for row in s.queue[a.args[0]].rows if row.live]
    return (any(r.prev_row is None and r.spec == 0 and (r.placed or 0) > 0 and not r.partial
                for r in rows)
            and any(r.prev_row is not None and r.spec > 0 for r in rows))


def preempt_with_drafts_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A preemption hit a request with a row carrying drafts in flight."""
    return a.name == "preempt" and any(
        row.live and row.req == a.args[0] and row.spec > 0 for step in s.queue for row in step.rows)


def skipped_with_step_in_flight(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A step was scheduled without a request it could hold, one with a step in flight."""
    return a.name == "schedule" and any(
        r not in a.args and has_step_in_flight(s, r) for r in eligible(s, b))


def _decoding_drafts(s: State, a: Action, b: Bounds) -> list[int]:
    """A schedule's drafts on its rows whose drafts exist (rows it could give K)."""
    return [d for r, d in zip(a.args, a.drafts, strict=False)
            if drafts_scheduled(s, b, r, s.requests[r].prefill_left > 0)]


def fewer_drafts(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A decoding row was scheduled with fewer drafts than the drafter proposed (K)."""
    return a.name == "schedule" and any(d < b.spec_tokens for d in _decoding_drafts(s, a, b))


def no_drafts_beside_all(s: State, a: Action, t: State, b: Bounds) -> bool:
    """One step held a decoding row with none of its drafts beside a row with all K."""
    if a.name != "schedule":
        return False
    counts = set(_decoding_drafts(s, a, b))
    return 0 in counts and b.spec_tokens in counts


def absent_after_own(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A request was scheduled with its newest token in an in-flight step before the newest
    one, having been left out of the newest (pipeline batches)."""
    if a.name != "schedule" or not s.queue:
        return False
    newest = s.queue[-1]
    return any(
        not any(row.live and row.req == r for row in newest.rows)
        and any(row.live and row.req == r and not row.partial
                for step in s.queue[:-1] for row in step.rows)
        for r in a.args)


def state_row_reused(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A request arrived into a state row an earlier request held."""
    if a.name != "arrive" or not s.table:
        return False
    earlier = sum(req.status != Status.ABSENT for req in s.requests)
    return earlier >= len(s.table)


def closed_owner_row_written(s: State, a: Action, t: State, b: Bounds) -> bool:
    """A launch scattered a dropped row into the state row of a request that had closed (its
    release waited for it)."""
    return a.name == "launch" and any(
        not row.live and row.req >= 0 and s.requests[row.req].status in CLOSED
        for row in s.queue[a.args[0]].rows)


class Sometimes(NamedTuple):
    name: str
    reached: Callable[[State, Action, State, Bounds], bool]
    applies: Callable[[Bounds], bool]


def _two(b: Bounds) -> bool:
    """Two requests can be active at once (with state rows, each needs a row of its own)."""
    return b.requests >= 2 and (b.state != "rows" or state_row_count(b) >= 2)


def _async(b: Bounds) -> bool:
    """Steps can overlap: depth 2, and some request that is not host-sync."""
    return b.depth >= 2 and not (b.host_sync and b.requests == 1)


SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes("combined_from_mirror", combined_from_mirror, _async),
    Sometimes("combined_from_host", combined_from_host, lambda b: b.max_tokens >= 2),
    Sometimes(
        "finish_with_step_in_flight",
        finish_with_step_in_flight,
        lambda b: _async(b) and b.finish and b.max_tokens >= 2,
    ),
    Sometimes("abort_hits_in_flight", abort_hits_in_flight, lambda b: b.abort),
    Sometimes("preempt_hits_in_flight", preempt_hits_in_flight, lambda b: b.preempt),
    Sometimes(
        "row_moves",
        row_moves,
        lambda b: _async(b) and _two(b) and b.max_tokens >= 2,
    ),
    Sometimes(
        "slot_reused",
        slot_reused,
        # More steps than slots: tokens plus partial-prefill chunks, or a dropped token redone.
        lambda b: b.requests * (b.max_tokens + b.prefill_chunks - 1) > b.slots
        or (b.preempt and b.preempt_policy == "drop"),
    ),
    Sometimes("steps_overlap", steps_overlap, _async),
    Sometimes(
        "resumed_after_preempt", resumed_after_preempt, lambda b: b.preempt and b.max_tokens >= 2
    ),
    Sometimes(
        "preempted_token_delivered", preempted_token_delivered,
        lambda b: b.preempt and b.preempt_policy == "keep",
    ),
    Sometimes(
        "resume_waited_for_placeholder", resume_waited_for_placeholder,
        lambda b: b.preempt and b.preempt_policy == "keep" and b.max_tokens >= 2,
    ),
    Sometimes(
        "partial_prefill_beside_mirror", partial_prefill_beside_mirror,
        lambda b: b.prefill_chunks >= 2 and _async(b) and _two(b) and b.max_tokens >= 2
        and b.guard,
    ),
    Sometimes(
        "host_sync_skipped", host_sync_skipped,
        lambda b: b.host_sync and _async(b) and _two(b),
    ),
    Sometimes(
        "fault_spares_bystander", fault_spares_bystander,
        lambda b: b.faults and _async(b) and _two(b),
    ),
    Sometimes("fault_after_launch", fault_after_launch, lambda b: b.faults),
    Sometimes(
        "mirror_read_three_in_flight", mirror_read_three_in_flight,
        # Three steps in flight need three token steps: one request of three tokens, or two.
        lambda b: b.depth >= 3 and _async(b) and b.max_tokens >= 2
        and b.requests * b.max_tokens >= 3 and b.guard,
    ),
    *(Sometimes(f"accepted_{n}", accepted(n), drafts_at_least(max(n, 1))) for n in range(3)),
    Sometimes("accepted_counts_differ", accepted_counts_differ,
              lambda b: b.spec_tokens >= 1 and _two(b) and b.max_tokens >= 2),
    Sometimes("reentry_beside_device_drafts", reentry_beside_device_drafts,
              lambda b: b.spec_tokens >= 1 and _async(b) and _two(b) and b.guard
              and b.max_tokens >= 3 and (b.preempt or b.host_sync)),
    Sometimes("preempt_with_drafts_in_flight", preempt_with_drafts_in_flight,
              lambda b: b.spec_tokens >= 1 and b.preempt and b.max_tokens >= 2),
    # vLLM's scheduler freedoms (subsets): each one reached.
    Sometimes("skipped_with_step_in_flight", skipped_with_step_in_flight,
              lambda b: b.subsets and _async(b) and _two(b) and b.max_tokens >= 2),
    Sometimes("fewer_drafts", fewer_drafts,
              lambda b: b.subsets and b.spec_tokens >= 1 and b.max_tokens >= 2),
    Sometimes("no_drafts_beside_all", no_drafts_beside_all,
              lambda b: b.subsets and b.spec_tokens >= 1 and _two(b)
              and b.max_tokens >= 2),
    Sometimes("absent_after_own", absent_after_own,
              lambda b: b.subsets and b.depth >= 3 and _async(b) and _two(b)
              and b.max_tokens >= 2),
    # Per-request state rows.
    Sometimes("state_row_reused", state_row_reused,
              lambda b: b.state == "rows" and 0 < b.state_rows < b.requests),
    Sometimes("closed_owner_row_written", closed_owner_row_written,
              lambda b: b.state == "rows" and _async(b) and (b.finish or b.abort)
              and b.max_tokens >= 2),
)

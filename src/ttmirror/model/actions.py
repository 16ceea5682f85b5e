"""Actions of the model, one function each.

Every action takes the current state (and its parameters) and returns the next state, or
None when its precondition does not hold. Steps are named by their position ``q`` in the
in-flight queue (0 = oldest). The device-side actions (combine, launch, readback) are the
moments the device's effects happen; the implementation must enforce each precondition with
queue order, events or host checks.

Reads and writes of mirror slots check the slot rules at the moment of access and record a
broken rule in the ghost variable ``broken`` (a history variable, as a TLA+ spec would).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import combinations, permutations, product
from typing import NamedTuple

from .state import (
    CLOSED,
    FREE_ROW,
    GARBAGE,
    HOST_SYNC_REQUEST,
    PLACEHOLDER,
    REJECTED,
    Bounds,
    Phase,
    Request,
    Row,
    Slot,
    State,
    Status,
    Step,
    Token,
)

READ_RELEASED = "NoReadOfReleasedOrOverwrittenSlot"
REWRITE_WITH_READER = "NoRewriteWhileReaderOutstanding"
WRITE_UNHELD_ROW = "NoWriteToUnheldStateRow"


class Action(NamedTuple):
    """An action name and its arguments: a request id, a queue position, a slot, or a row order;
    a schedule's drafts per row where the scheduler chooses them (``Bounds.subsets``)."""

    name: str
    args: tuple[int, ...] = ()
    drafts: tuple[int, ...] = ()

    def label(self) -> str:
        """Short human label, e.g. ``schedule(r1,r0)``, ``schedule(r1+2,r0+0)`` (drafts chosen
        per row) or ``launch(q=0)``."""
        if not self.args:
            return self.name
        if self.name == "schedule":
            if self.drafts:
                return "schedule(" + ",".join(
                    f"r{r}+{d}" for r, d in zip(self.args, self.drafts, strict=True)) + ")"
            return "schedule(" + ",".join(f"r{r}" for r in self.args) + ")"
        if self.name in REQUEST_ACTIONS:
            return f"{self.name}(r{self.args[0]})"
        if self.name == "chunk_prefill":
            return f"chunk_prefill(r{self.args[0]}, {'partial' if self.args[1] else 'whole'})"
        if self.name == "release":
            return f"release(slot{self.args[0]})"
        if self.name == "release_row":
            return f"release_row({self.args[0]})"
        if self.name == "launch" and len(self.args) > 1:  # with drafts: each row's accepted a
            return f"launch(q={self.args[0]}, a={','.join(map(str, self.args[1:]))})"
        return f"{self.name}(q={self.args[0]})"


REQUEST_ACTIONS = ("arrive", "finish", "abort", "preempt", "resume")
FAULT = "fault"
"""The device failing a step: an action of the model only where `Bounds.faults` is on (the
conformance lockstep drives ALL_ACTIONS; faults are driven by the serving loop and the soak)."""
STEP_ACTIONS = ("combine", "launch", "readback_issue", "readback_complete")
ALL_ACTIONS = (
    "allocate",
    "arrive",
    "schedule",
    "combine",
    "launch",
    "readback_issue",
    "readback_complete",
    "apply",
    "release",
    "finish",
    "abort",
    "preempt",
    "resume",
)
RELEASE_ROW = "release_row"
"""Handing a state row back: an action of the model only with state rows."""


def actions_of(b: Bounds) -> tuple[str, ...]:
    """The actions a conformance run drives at bounds `b`: ALL_ACTIONS, and with state rows
    `release_row` (faults are the serving loop's and the soak's)."""
    return (*ALL_ACTIONS, RELEASE_ROW) if b.state == "rows" else ALL_ACTIONS


# ---------------------------------------------------------------------------------------------
# Derived values (operators): read the state, never change it.


def in_flight(s: State, req: int) -> int:
    """How many in-flight rows of ``req`` will still deliver a token (its placeholders)."""
    return sum(
        row.live and not row.partial and row.req == req for step in s.queue for row in step.rows
    )


def has_step_in_flight(s: State, req: int) -> bool:
    """Some in-flight step holds a live row of ``req``, partial-prefill rows included."""
    return any(row.live and row.req == req for step in s.queue for row in step.rows)


def row_in_flight(s: State, idx: int) -> bool:
    """Some in-flight step has a row, live or dropped, whose launch scatters into state row
    ``idx`` (the device writes it whether or not the host still wants the token)."""
    return any(row.idx == idx for step in s.queue for row in step.rows)


def newest_on_device(s: State, b: Bounds, req: int) -> bool:
    """``req``'s newest token is still in flight: some in-flight step holds a live row of it whose
    sampled id is its next token (a partial prefill's is discarded, unless the bad variant)."""
    return any(mirror_rows(step, req, b) for step in s.queue)


def is_host_sync(b: Bounds, req: int) -> bool:
    """``req`` needs its newest token on the host before its next step."""
    if b.host_sync_of:
        return req in b.host_sync_of
    return b.host_sync and req == HOST_SYNC_REQUEST


def next_pos(s: State, req: int) -> int:
    """Position of ``req``'s newest token: delivered ones plus those still in flight. With
    drafts, the fewest it can be: each in-flight step yields at least one token."""
    return len(s.requests[req].delivered) + in_flight(s, req)


def placeholders(s: State, b: Bounds, req: int) -> int:
    """The host's output placeholders of ``req``: its own counter with drafts, else the live
    in-flight rows (one token each)."""
    return s.requests[req].placeholders if b.spec_tokens else in_flight(s, req)


def yielded(s: State, q: int, req: int) -> int:
    """With drafts: the tokens step q's launch yielded for ``req`` (a + 1 per live row)."""
    step = s.queue[q]
    return sum(a + 1 for row, a in zip(step.rows, step.accepted, strict=False)
               if row.live and not row.partial and row.req == req)


def true_pos(s: State, q: int, req: int) -> int:
    """With drafts: the position of ``req``'s newest token as step q's combine must see it:
    delivered tokens plus what the steps before q yielded (all launched by then)."""
    return len(s.requests[req].delivered) + sum(yielded(s, j, req) for j in range(q))


def drafts_after(token: Token, k: int) -> tuple[Token, ...]:
    """The drafter's k proposals after ``token``: for the k positions that follow it (it runs on
    the device from the accepted tokens); garbage in, garbage out."""
    r, pos = token
    if r < 0:
        return (token,) * k
    return tuple((r, pos + i) for i in range(1, k + 1))


def expand(row: Row, newest: Token, count: int) -> tuple[Token, ...]:
    """With drafts: the ``count`` tokens a row yielded, read back: its accepted drafts (the
    sequence's tokens after ``row.pos``) then its newest; none for an unreadable count."""
    return (*((row.req, row.pos + i) for i in range(1, count)), newest) if count else ()

def budget(b: Bounds, req: int) -> int:
    """The tokens ``req`` generates before it finishes on its own."""
    return b.max_tokens_of[req] if b.max_tokens_of else b.max_tokens


def host_token(s: State, req: int, pos: int) -> Token:
    """The host token table at ``pos``: authoritative if delivered, else a placeholder."""
    if pos == 0:
        return (req, 0)
    delivered = s.requests[req].delivered
    return delivered[pos - 1] if pos <= len(delivered) else PLACEHOLDER


def eligible(s: State, b: Bounds) -> list[int]:
    """Requests the scheduler may put in the next step (must put, without ``subsets``): active
    with budget left."""
    return [
        r
        for r, req in enumerate(s.requests)
        if req.status in (Status.WAITING, Status.RUNNING)
        # Skipped only when sure to be done: every in-flight step yields at least one token.
        and next_pos(s, r) < budget(b, r)
        # A host-sync request waits for its step to be applied (unless the bad variant).
        and not (is_host_sync(b, r) and has_step_in_flight(s, r)
                 and b.variant != "host-sync-unguarded")
    ]


def mirror_rows(step: Step, req: int, b: Bounds) -> list[int]:
    """Rows of ``step`` whose sampled id is ``req``'s newest token for a later combine to read
    through the previous-row map: live, and not a partial prefill's discarded id."""
    feeds = b.variant == "partial-prefill-feeds-mirror"
    return [i for i, row in enumerate(step.rows)
            if row.live and row.req == req and (feeds or not row.partial)]


def writer(s: State, slot: int) -> int | None:
    """Queue position of the in-flight step whose launch wrote ``slot`` last; None if retired."""
    found = None
    for q, step in enumerate(s.queue):
        if step.slot == slot and step.phase >= Phase.LAUNCHED:
            found = q
    return found


def readers_outstanding(s: State, slot: int, q: int) -> bool:
    """Someone still has to read what ``slot`` holds before step q overwrites it.

    Its writer's readback may not be complete, or a combine still has to read it; the combine
    of the step right after q reads what q is about to write, so it does not count.
    """
    return any(
        (step.slot == slot and Phase.LAUNCHED <= step.phase < Phase.READBACK_DONE)
        or (j != q + 1 and step.src_slot == slot and step.phase == Phase.SCHEDULED)
        for j, step in enumerate(s.queue)
    )


DEAD_ROW = Row(req=-1, pos=0, prev_row=None, consumed=None, live=False)
"""A dropped row: its token is never delivered nor read, so what it held is forgotten."""


def dead(row: Row) -> Row:
    """``row`` dropped. With state rows it keeps its request and its ``idx_mapping`` entry: its
    launch still scatters into that state row, which must not have changed owner by then."""
    return DEAD_ROW if row.idx < 0 else DEAD_ROW._replace(req=row.req, idx=row.idx)


def _drop(s: State, req: int) -> State:
    """Drop every in-flight row of ``req`` and forget its tokens in slots and host copies.

    Nothing reads them again: later rows of ``req`` restart from host ids. Forgetting them
    keeps states that differ only in dead values equal.
    """

    def scrub(tokens: tuple[Token, ...] | None) -> tuple[Token, ...] | None:
        if tokens is None:
            return None
        return tuple(GARBAGE if t[0] == req else t for t in tokens)

    queue = tuple(
        step._replace(
            rows=tuple(dead(r) if r.req == req else r for r in step.rows),
            host_copy=scrub(step.host_copy),
        )
        for step in s.queue
    )
    slots = tuple(_scrub_slot(slot, req, scrub) for slot in s.slots)
    # Its state row is read again only after a host row of it rewrote it (it restarts from host
    # ids), if ever.
    table = tuple(row._replace(newest=GARBAGE, position=-1) if row.owner == req else row
                  for row in s.table)
    # Its placeholders go with its rows; drafts after a dropped token are no one's.
    r = s.requests[req]._replace(placeholders=0, drafts_ready=False)
    return _set_request(s._replace(queue=queue, slots=slots, table=table), req, r)


def _scrub_slot(slot: Slot, req: int,
                scrub: Callable[[tuple[Token, ...] | None], tuple[Token, ...] | None]) -> Slot:
    """``slot`` with ``req``'s tokens forgotten, and with drafts their counts and positions."""
    if not slot.counts:
        return slot._replace(content=scrub(slot.content))
    assert slot.content is not None
    mine = [t[0] == req for t in slot.content]
    return slot._replace(
        content=scrub(slot.content),
        counts=tuple(0 if m else c for m, c in zip(mine, slot.counts, strict=True)),
        positions=tuple(-1 if m else p for m, p in zip(mine, slot.positions, strict=False)),
    )


def _set_step(s: State, q: int, step: Step) -> State:
    return s._replace(queue=(*s.queue[:q], step, *s.queue[q + 1:]))


def _set_request(s: State, req: int, value: Request) -> State:
    return s._replace(requests=(*s.requests[:req], value, *s.requests[req + 1:]))


def _read_slot(s: State, slot: int, row: int) -> Token:
    """What the device reads from ``slot`` at ``row``: garbage if unwritten or handed back."""
    content = s.slots[slot].content
    if content is None or s.slots[slot].released or row >= len(content):
        return GARBAGE
    return content[row]


# ---------------------------------------------------------------------------------------------
# Actions.


def allocate(s: State, b: Bounds) -> State | None:
    """Load: allocate the ring of K mirror slots, before any step (and so any trace capture)."""
    if s.allocated:
        return None
    return s._replace(allocated=True)


def arrive(s: State, b: Bounds, req: int) -> State | None:
    """A request arrives; its first step prefills from host ids. With state rows it is given
    the lowest free state row (none free: it waits, as vLLM's ``max_num_seqs`` holds it back)."""
    if not s.allocated or s.requests[req].status != Status.ABSENT:
        return None
    r = s.requests[req]._replace(status=Status.WAITING)
    if b.state != "rows":
        return _set_request(s, req, r)
    free = next((i for i, row in enumerate(s.table) if row.owner < 0), None)
    if free is None:
        return None
    table = (*s.table[:free], FREE_ROW._replace(owner=req), *s.table[free + 1:])
    return _set_request(s._replace(table=table), req, r._replace(state_row=free))


def schedule(s: State, b: Bounds, order: tuple[int, ...],
             drafts: tuple[int, ...] = ()) -> State | None:
    """Schedule a step over the eligible requests in ``order`` (every one of them, or with
    ``subsets`` any non-empty subset), building the previous-row map (the ring) or the
    ``idx_mapping`` (state rows); with ``subsets`` and drafts, ``drafts[i]`` is how many of its
    drafts row i carries (any up to the drafts it has; () = all of them)."""
    if not _schedulable(s, b, order, drafts):
        return None
    # Drafts per row are the scheduler's to choose with subsets (none given: all each row has).
    chosen = bool(b.subsets and b.spec_tokens and drafts)
    prev = s.queue[-1] if s.queue else None
    rows = []
    for i, r in enumerate(order):
        row = _scheduled_row(s, b, prev, i, r, drafts[i] if chosen else None)
        if row is None:
            return None
        rows.append(row)
    uses_mirror = b.state == "ring" and any(row.prev_row is not None for row in rows)
    step = Step(
        slot=s.next_slot,
        src_slot=prev.slot if (prev is not None and uses_mirror) else None,
        phase=Phase.SCHEDULED,
        rows=tuple(rows),
        host_copy=None,
    )
    return s._replace(
        queue=(*s.queue, step),
        next_slot=(s.next_slot + 1) % b.slots,
        requests=_scheduled_requests(s, b, order, rows),
    )


def _schedulable(s: State, b: Bounds, order: tuple[int, ...], drafts: tuple[int, ...]) -> bool:
    """A step may be scheduled now over ``order`` with ``drafts``: a free place in the
    pipeline, and an order (and draft counts) the bounds allow."""
    if not s.allocated or len(s.queue) >= b.depth or not order:
        return False
    todo = eligible(s, b)
    if b.subsets:
        if len(set(order)) != len(order) or not set(order) <= set(todo):
            return False
        if not b.condense and list(order) != sorted(order):
            return False
    elif sorted(order) != todo or (not b.condense and list(order) != todo):
        return False
    return not drafts or bool(b.subsets and b.spec_tokens and len(drafts) == len(order))


def _scheduled_row(s: State, b: Bounds, prev: Step | None, i: int, r: int,
                   chosen: int | None) -> Row | None:
    """Request ``r``'s row at place ``i`` of the step (``chosen``: the drafts the scheduler gave
    it, None for all it has); None where ``chosen`` is more than it has."""
    req = s.requests[r]
    # Arrived and resumed requests prefill from host ids, and so does a host-sync request
    # (its next input is built on the host): none of them reads the device.
    from_host = req.status == Status.WAITING or is_host_sync(b, r)
    idx = -1
    if b.state == "rows":
        idx = req.state_row
        if b.variant == "idx-from-previous-order" and prev is not None and i < len(prev.rows):
            idx = prev.rows[i].idx  # known-bad: the previous step's mapping reused
    prev_row = None
    if b.guard and prev is not None and not from_host:
        # The guard: a request whose newest token is still in flight reads it on the device.
        # The ring: from the previous step's slot, through the previous-row map (invariant
        # NewestTokenInNewestStep: at any depth it is there without subsets). State rows:
        # from its own state row, whichever in-flight step wrote it. A partial-prefill row's
        # id is discarded, never mirrored.
        if b.state == "ring":
            prev_row = next(iter(mirror_rows(prev, r, b)), None)
        elif b.variant == "skipped-from-previous-step":  # known-bad: the ring's lookup
            prev_row = idx if mirror_rows(prev, r, b) else None
        elif newest_on_device(s, b, r):
            prev_row = idx
    partial = req.prefill_left > 0
    if not b.spec_tokens:
        return Row(req=r, pos=next_pos(s, r), prev_row=prev_row, consumed=None, live=True,
                   partial=partial, idx=idx)
    spec = drafts_scheduled(s, b, r, partial)
    if chosen is not None:
        if not 0 <= chosen <= spec:
            return None
        spec = chosen
    if prev_row is not None:  # newest token, position and drafts: all on the device
        return Row(req=r, pos=-1, prev_row=prev_row, consumed=None, live=True, partial=partial,
                   spec=spec, idx=idx)
    # A host row: its position is the host's count of computed tokens, its drafts those read
    # back after its newest token (placeholders, -1, where the host has none).
    placed = len(req.delivered) + req.placeholders
    staged = (drafts_after(host_token(s, r, placed), spec) if req.drafts_ready
              else (PLACEHOLDER,) * spec)
    return Row(req=r, pos=-1, prev_row=None, consumed=None, live=True, partial=partial,
               spec=spec, placed=placed, drafts=staged, idx=idx)


def _scheduled_requests(s: State, b: Bounds, order: tuple[int, ...],
                        rows: list[Row]) -> tuple[Request, ...]:
    """The requests once the step over ``order`` is scheduled: running, a prefill chunk
    further, and with drafts their placeholders and drafts counted."""
    requests = tuple(
        req._replace(status=Status.RUNNING, unchecked=False,
                     prefill_left=max(req.prefill_left - 1, 0)) if i in order else req
        for i, req in enumerate(s.requests)
    )
    if not b.spec_tokens:
        return requests
    # Placeholders: 1 + spec per row that will yield. Drafts follow this step's rows. A request
    # the scheduler left out keeps its own: in its state row (state rows), or with the ring in
    # the slot of its last step, read back by its next step at depth 2 (deeper, the ring cannot
    # reach them: `ring-subsets-depth-3`). Without subsets only a request that could not be
    # scheduled is left out, and it keeps none (the ring's first rule).
    by_req = {row.req: row for row in rows}
    keeps = b.state == "rows" or b.subsets
    return tuple(
        req._replace(
            placeholders=req.placeholders + (
                1 + by_req[i].spec if i in by_req and not by_req[i].partial else 0),
            drafts_ready=(not by_req[i].partial) if i in by_req
            else keeps and req.drafts_ready)
        for i, req in enumerate(requests)
    )


def drafts_scheduled(s: State, b: Bounds, r: int, partial: bool) -> int:
    """How many drafts the host may schedule after ``r``'s newest token: K if the drafter
    proposed them, else none (with ``subsets`` the scheduler takes any number up to it)."""
    req = s.requests[r]
    if partial:
        return 0  # a prefill chunk carries no drafts
    if req.drafts_ready and req.status != Status.WAITING:
        return b.spec_tokens
    # New, resumed, or absent from the previous step: no drafts exist for it. The known-bad
    # variant schedules placeholder drafts for a re-entering request past its prompt anyway.
    reenters = len(req.delivered) > 0  # past its prompt, newest token on the host
    return b.spec_tokens if b.variant == "reentering-drafts-from-device" and reenters else 0


def combine(s: State, b: Bounds, q: int) -> State | None:
    """Build step q's input ids on device: host ids, or the previous slot through the row map."""
    if q >= len(s.queue) or s.queue[q].phase != Phase.SCHEDULED:
        return None
    if q > 0 and s.queue[q - 1].phase < Phase.LAUNCHED:
        return None  # the previous step's sampler has not written its slot yet
    step = s.queue[q]
    broken = s.broken
    rows = []
    for row in step.rows:
        if not row.live:
            rows.append(row)  # dropped: what the device computes there is never used
            continue
        if row.prev_row is not None and b.state == "ring":
            assert step.src_slot is not None
            if s.slots[step.src_slot].released:
                broken = broken | {READ_RELEASED}
        if b.spec_tokens:
            rows.append(_combine_with_drafts(s, b, step, q, row))
        elif row.prev_row is None:
            rows.append(row._replace(consumed=host_token(s, row.req, row.pos)))
        elif b.state == "rows":
            rows.append(row._replace(consumed=s.table[row.idx].newest))
        else:
            assert step.src_slot is not None
            rows.append(row._replace(consumed=_read_slot(s, step.src_slot, row.prev_row)))
    step = step._replace(phase=Phase.COMBINED, rows=tuple(rows))
    return _set_step(s, q, step)._replace(broken=broken)


def _combine_with_drafts(s: State, b: Bounds, step: Step, q: int, row: Row) -> Row:
    """One live row's combine with drafts: its newest token, position and drafts from the host
    (a host row), or all three on the device: from the previous step's slot (the ring) or from
    its state row (state rows), its draft count from the step's per-row counts."""
    truth = true_pos(s, q, row.req)
    if row.prev_row is None:
        assert row.placed is not None
        newest = host_token(s, row.req, row.placed)
        return row._replace(pos=truth, consumed=newest, placed=row.placed, drafts=row.drafts)
    if b.state == "rows":
        entry = s.table[row.idx]
        newest = entry.newest
        placed = entry.position if newest != GARBAGE else -1
    else:
        assert step.src_slot is not None
        src = s.slots[step.src_slot]
        newest = _read_slot(s, step.src_slot, row.prev_row)
        readable = newest != GARBAGE and row.prev_row < len(src.positions)
        placed = src.positions[row.prev_row] if readable else -1
    count = row.spec
    if b.variant == "draft-count-of-another-row":  # known-bad: the first row's count for all
        count = step.rows[0].spec
    return row._replace(pos=truth, consumed=newest, placed=placed,
                        drafts=drafts_after(newest, count))


def launch(s: State, b: Bounds, q: int, *accepted: int) -> State | None:
    """Run step q's forward and sampler; the sampler writes its tokens into the step's slot.
    With drafts, verification accepts ``accepted[i]`` drafts of row i (chosen: the model does not
    know which guesses the target agrees with) and the device advances the row's position."""
    if q >= len(s.queue) or s.queue[q].phase != Phase.COMBINED:
        return None
    step = s.queue[q]
    if tuple(accepted) not in acceptance_choices(step, b):
        return None
    broken = s.broken
    if readers_outstanding(s, step.slot, q):
        broken = broken | {REWRITE_WITH_READER}
    slots = list(s.slots)
    positions: tuple[int, ...] = ()
    if b.spec_tokens:
        content, counts, positions = _verify(step, b, accepted)
        # With state rows the positions go to the state rows, not to the readback.
        slots[step.slot] = slots[step.slot]._replace(
            content=content, released=False, counts=counts,
            positions=positions if b.state == "ring" else ())
        step = step._replace(accepted=tuple(accepted))
    else:
        # The next token is a function of the consumed one: a stale input yields a wrong token;
        # a partial-prefill row's sample (mid-prompt) is no token of the sequence.
        content = tuple(
            (row.req, row.pos + 1)
            if row.live and not row.partial and row.consumed == (row.req, row.pos) else GARBAGE
            for row in step.rows
        )
        slots[step.slot] = slots[step.slot]._replace(content=content, released=False)
    s = _set_step(s, q, step._replace(phase=Phase.LAUNCHED))
    if b.state == "rows":
        s, broken = _post_update(s, step, content, positions, broken)
    return s._replace(slots=tuple(slots), broken=broken)


def _post_update(s: State, step: Step, content: tuple[Token, ...],
                 positions: tuple[int, ...], broken: frozenset[str]
                 ) -> tuple[State, frozenset[str]]:
    """With state rows: the launch scatters each row's newest token (and with drafts its advanced
    position) into the state row its ``idx_mapping`` entry names, dropped rows too: the device
    does not know the host no longer wants them. Writing a row its request no longer holds
    breaks the state rows' ownership rule."""
    table = list(s.table)
    for i, row in enumerate(step.rows):
        if table[row.idx].owner != row.req:
            broken = broken | {WRITE_UNHELD_ROW}
        # What a dropped row computes is no one's token: forgotten, as its slot entry is.
        newest = content[i] if row.live else GARBAGE
        position = positions[i] if positions and row.live else -1
        table[row.idx] = table[row.idx]._replace(newest=newest, position=position)
    return s._replace(table=tuple(table)), broken


def inputs_right(row: Row) -> bool:
    """With drafts: a live row consumed its request's newest token, at its position, and the
    drafter's proposals for the positions after it."""
    return (row.consumed == (row.req, row.pos) and row.placed == row.pos
            and row.drafts == drafts_after((row.req, row.pos), row.spec))


def acceptance_choices(step: Step, b: Bounds) -> list[tuple[int, ...]]:
    """The launch's possible verdicts: () without drafts; with drafts, per row the accepted
    count, 0..spec for a row whose inputs are right, else 0 (its output is garbage anyway)."""
    if not b.spec_tokens:
        return [()]
    choices: list[tuple[int, ...]] = [()]
    for row in step.rows:
        top = row.spec if row.live and not row.partial and inputs_right(row) else 0
        choices = [(*c, a) for c in choices for a in range(top + 1)]
    return choices


def _verify(step: Step, b: Bounds, accepted: tuple[int, ...]
            ) -> tuple[tuple[Token, ...], tuple[int, ...], tuple[int, ...]]:
    """With drafts: what the launch writes into its slot per row: the newest token (the one the
    target sampled after the accepted drafts), the count a + 1, and the advanced position."""
    content, counts, positions = [], [], []
    for row, a in zip(step.rows, accepted, strict=True):
        if not row.live or row.partial:  # nothing of it is a token of the sequence
            content.append(GARBAGE)
            counts.append(0)
            positions.append(-1)
            continue
        if not inputs_right(row):
            content.append(GARBAGE)
        elif b.variant == "rejected-draft-newest" and a < row.spec:
            content.append(REJECTED)  # the draft at the bonus token's position, rejected
        else:
            content.append((row.req, row.pos + a + 1))
        counts.append(a + 1)
        assert row.placed is not None
        advance = 1 + row.spec if b.variant == "positions-advance-by-spec" else a + 1
        positions.append(row.placed + advance)
    return tuple(content), tuple(counts), tuple(positions)


def readback_issue(s: State, b: Bounds, q: int) -> State | None:
    """Enqueue the non-blocking copy of step q's slot to a host tensor, and its event."""
    if q >= len(s.queue) or s.queue[q].phase != Phase.LAUNCHED:
        return None
    return _set_step(s, q, s.queue[q]._replace(phase=Phase.READBACK_ISSUED))


def readback_complete(s: State, b: Bounds, q: int) -> State | None:
    """Step q's readback event completes: the host tensor now holds the slot's content."""
    if q >= len(s.queue) or s.queue[q].phase != Phase.READBACK_ISSUED:
        return None
    step = s.queue[q]
    broken = s.broken
    if s.slots[step.slot].released or writer(s, step.slot) != q:
        broken = broken | {READ_RELEASED}
    host_copy = tuple(_read_slot(s, step.slot, i) for i in range(len(step.rows)))
    step = step._replace(phase=Phase.READBACK_DONE, host_copy=host_copy)
    if b.spec_tokens:  # the counts come back with the tokens
        step = step._replace(host_counts=tuple(
            _read_count(s, step.slot, i) for i in range(len(step.rows))))
    return _set_step(s, q, step)._replace(broken=broken)


def _read_count(s: State, slot: int, row: int) -> int:
    """With drafts: the count the device holds for ``row`` of ``slot``; an unreadable one reads
    as 1 (the host then delivers the garbage token it read beside it)."""
    st = s.slots[slot]
    if st.content is None or st.released or row >= len(st.counts):
        return 1
    return st.counts[row]


def apply(s: State, b: Bounds) -> State | None:
    """Retire the oldest step: deliver each live row's tokens; max tokens finishes a request."""
    if not s.queue or s.queue[0].phase != Phase.READBACK_DONE:
        return None
    step = s.queue[0]
    assert step.host_copy is not None
    requests = list(s.requests)
    done: list[int] = []
    for i, (row, token) in enumerate(zip(step.rows, step.host_copy, strict=True)):
        if not row.live or row.partial:
            continue  # dropped since scheduling, or a partial prefill's discarded id
        req = requests[row.req]
        if b.spec_tokens:
            count = step.host_counts[i]
            # Drain what the row yielded; roll back what it rejected (vLLM 0.33): together the
            # 1 + spec it was scheduled. The known-bad variant drains 1 for the yielded ones.
            drained = (1 if b.variant == "placeholders-drain-by-one" else count) + (
                row.spec + 1 - count)
            req = req._replace(placeholders=max(req.placeholders - drained, 0))
            # A run past max_tokens is cut there (as vLLM's stop check cuts it).
            delivered = (*req.delivered, *expand(row, token, count))[:budget(b, row.req)]
        else:
            delivered = (*req.delivered, token)
        if len(delivered) >= budget(b, row.req):
            req = req._replace(
                status=Status.FINISHED, delivered=delivered, closed_at=len(delivered),
                unchecked=False,
            )
            done.append(row.req)
        else:
            req = req._replace(delivered=delivered, unchecked=True)
        requests[row.req] = req
    s = s._replace(queue=s.queue[1:], requests=tuple(requests))
    for r in done:  # with drafts a later step may still carry it: those rows drop
        if has_step_in_flight(s, r):
            s = _drop(s, r)
    return s


def release(s: State, b: Bounds, slot: int) -> State | None:
    """Hand a slot back: its readback is done and no combine will read it again."""
    st = s.slots[slot]
    if not s.allocated or st.content is None or st.released:
        return None
    w = writer(s, slot)
    if b.release_at == "complete":
        pending_combine = any(
            step.src_slot == slot and step.phase == Phase.SCHEDULED for step in s.queue
        )
        if w is not None or pending_combine:
            return None
    elif w is not None and s.queue[w].phase < Phase.READBACK_ISSUED:
        return None  # known-bad variant: hands the slot back once its readback is only issued
    slots = list(s.slots)
    # A handed-back slot's content can never be read correctly again: forget it.
    slots[slot] = st._replace(content=(), released=True, counts=(), positions=())
    return s._replace(slots=tuple(slots))


def release_row(s: State, b: Bounds, idx: int) -> State | None:
    """With state rows: hand state row ``idx`` back once its owner closed and no in-flight step
    will still scatter into it; the next arrival may take it."""
    if b.state != "rows" or idx >= len(s.table):
        return None
    owner = s.table[idx].owner
    if owner < 0 or s.requests[owner].status not in CLOSED:
        return None
    if row_in_flight(s, idx) and b.variant != "state-row-reused-in-flight":
        return None  # a step of its owner still writes it
    table = (*s.table[:idx], FREE_ROW, *s.table[idx + 1:])
    r = s.requests[owner]._replace(state_row=-1)
    return _set_request(s._replace(table=table), owner, r)


def finish(s: State, b: Bounds, req: int) -> State | None:
    """The newest delivered token was a stop token: the request finishes, in-flight rows drop."""
    r = s.requests[req]
    # A preempted request (keep) is stop-checked too when its in-flight token is delivered.
    if not b.finish or r.status in CLOSED or not r.unchecked:
        return None
    s = _drop(s, req)
    r = s.requests[req]  # as `_drop` left it: no placeholder, no drafts
    closed = r._replace(status=Status.FINISHED, closed_at=len(r.delivered), unchecked=False)
    return _set_request(s, req, closed)


def abort(s: State, b: Bounds, req: int) -> State | None:
    """The user aborts the request: nothing more is delivered, in-flight rows drop."""
    r = s.requests[req]
    if not b.abort or r.status not in (Status.WAITING, Status.RUNNING, Status.PREEMPTED):
        return None
    s = _drop(s, req)
    r = s.requests[req]  # as `_drop` left it: no placeholder, no drafts
    closed = r._replace(status=Status.ABORTED, closed_at=len(r.delivered), unchecked=False)
    return _set_request(s, req, closed)


def preempt(s: State, b: Bounds, req: int) -> State | None:
    """The KV budget is exceeded: the request is preempted; its in-flight tokens are kept and
    delivered (keep), or dropped (drop). It will prefill again in one step."""
    r = s.requests[req]
    if not b.preempt or r.status != Status.RUNNING or r.preemptions >= b.preemptions:
        return None
    if b.preempt_policy == "drop":
        s = _drop(s, req)
        r = s.requests[req]  # its placeholders went with its rows: it can resume
    preempted = r._replace(status=Status.PREEMPTED, unchecked=False, preemptions=r.preemptions + 1,
                           prefill_left=0, drafts_ready=False)
    return _set_request(s, req, preempted)


def resume(s: State, b: Bounds, req: int) -> State | None:
    """A preempted request waits again, once it owns no placeholder; it restarts from the
    host's authoritative tokens."""
    r = s.requests[req]
    if r.status != Status.PREEMPTED:
        return None
    if placeholders(s, b, req) > 0 and b.variant != "resume-with-placeholder":
        return None  # its in-flight token is still to be delivered (keep)
    return _set_request(s, req, r._replace(status=Status.WAITING))


def chunk_prefill(s: State, b: Bounds, req: int, partial: int) -> State | None:
    """Chunks sized per step (rule 11): whether ``req``'s next row is a partial prefill, said
    only while it owns no placeholder (a chunk reads host ids); with ``chunk_per_step`` only."""
    r = s.requests[req]
    if not b.chunk_per_step or r.status not in (Status.WAITING, Status.RUNNING):
        return None
    if in_flight(s, req) > 0:
        return None
    return _set_request(s, req, r._replace(prefill_left=int(bool(partial))))


def fault(s: State, b: Bounds, q: int) -> State | None:
    """The device fails step q before its readback completed: every request with a live row in
    it fails, its rows in the other in-flight step drop, and the step leaves the queue, so
    nothing of it is delivered; a slot its launch wrote is released as a retired writer's, and
    a failed newest step gives its slot back to the ring position."""
    if not b.faults or q >= len(s.queue) or s.queue[q].phase == Phase.READBACK_DONE:
        return None
    failed = sorted({row.req for row in s.queue[q].rows if row.live})
    if b.variant != "fault-spares-later-rows":  # known-bad: their rows elsewhere stay live
        for r in failed:
            s = _drop(s, r)
    for r in failed:
        req = s.requests[r]
        s = _set_request(s, r, req._replace(status=Status.FAILED, closed_at=len(req.delivered),
                                            unchecked=False))
    # The ring position goes back to a failed newest step's slot: the next step must not take
    # the slot after it, which at K = D is the older in-flight step's.
    newest = q == len(s.queue) - 1
    return s._replace(queue=(*s.queue[:q], *s.queue[q + 1:]),
                      next_slot=s.queue[q].slot if newest else s.next_slot)


# ---------------------------------------------------------------------------------------------
# The next-state relation.


def successors(s: State, b: Bounds) -> Iterator[tuple[Action, State]]:
    """Every enabled action and the state it leads to."""
    if not s.allocated:
        t = allocate(s, b)
        if t is not None:
            yield Action("allocate"), t
        return
    # Actions whose precondition fails on the record's status or phase alone are not tried
    # (the explorer's hot path); each function checks its whole precondition all the same.
    nreq = len(s.requests)
    for r, req in enumerate(s.requests):
        if req.status == Status.ABSENT and (t := arrive(s, b, r)) is not None:
            yield Action("arrive", (r,)), t
    if len(s.queue) < b.depth:
        for order, drafts in schedule_choices(s, b):
            if (t := schedule(s, b, order, drafts)) is not None:
                yield Action("schedule", order, drafts), t
    for q, step in enumerate(s.queue):
        if step.phase == Phase.COMBINED and b.spec_tokens:  # one launch per verdict
            for accepted in acceptance_choices(step, b):
                if (t := launch(s, b, q, *accepted)) is not None:
                    yield Action("launch", (q, *accepted)), t
        elif step.phase < Phase.READBACK_DONE:  # the one step action that moves it on
            name, fn = _STEP_FNS[step.phase]
            if (t := fn(s, b, q)) is not None:
                yield Action(name, (q,)), t
    if (t := apply(s, b)) is not None:
        yield Action("apply"), t
    for k, slot in enumerate(s.slots):
        held = slot.content is not None and not slot.released
        if held and (t := release(s, b, k)) is not None:
            yield Action("release", (k,)), t
    for k, entry in enumerate(s.table):
        if entry.owner >= 0 and (t := release_row(s, b, k)) is not None:
            yield Action("release_row", (k,)), t
    for r, req in enumerate(s.requests):
        if req.status not in _HAS_REQUEST_ACTIONS:
            continue
        for name, rfn in _REQUEST_FNS:
            if (t := rfn(s, b, r)) is not None:
                yield Action(name, (r,)), t
    for q in range(len(s.queue) if b.faults else 0):
        if (t := fault(s, b, q)) is not None:
            yield Action(FAULT, (q,)), t
    for r in range(nreq if b.chunk_per_step else 0):
        for partial in (0, 1):
            if (t := chunk_prefill(s, b, r, partial)) is not None and t != s:
                yield Action("chunk_prefill", (r, partial)), t


def schedule_choices(s: State, b: Bounds) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The scheduler's choices of the next step: the row order (of every eligible request, or
    with ``subsets`` of any non-empty subset) and, where it chooses them, each row's drafts."""
    todo = eligible(s, b)
    if not todo:
        return
    if b.subsets:
        groups = [c for n in range(1, len(todo) + 1) for c in combinations(todo, n)]
    else:
        groups = [tuple(todo)]
    chosen = b.subsets and b.spec_tokens
    top = {r: drafts_scheduled(s, b, r, s.requests[r].prefill_left > 0)
           for r in todo} if chosen else {}
    for group in groups:
        for order in permutations(group) if b.condense else [group]:
            if not chosen:
                yield order, ()
                continue
            for drafts in product(*(range(top[r] + 1) for r in order)):
                yield order, drafts


_STEP_FNS = (  # by the phase each moves a step on from
    ("combine", combine),
    ("launch", launch),
    ("readback_issue", readback_issue),
    ("readback_complete", readback_complete),
)
_REQUEST_FNS = (("finish", finish), ("abort", abort), ("preempt", preempt), ("resume", resume))
_HAS_REQUEST_ACTIONS = frozenset({Status.WAITING, Status.RUNNING, Status.PREEMPTED})
"""Where finish, abort, preempt or resume can be enabled: not absent (never unchecked), not
closed."""


def take(s: State, b: Bounds, action: Action) -> State | None:
    """The state ``action`` leads to from ``s`` (what `successors` pairs it with), or None
    when it is disabled."""
    if action.name == "schedule":
        return schedule(s, b, action.args, action.drafts)
    return ACTION_FNS[action.name](s, b, *action.args)


ACTION_FNS: dict[str, Callable[..., State | None]] = {
    "allocate": allocate, "arrive": arrive, "schedule": schedule, **dict(_STEP_FNS),
    "apply": apply, "release": release, **dict(_REQUEST_FNS), FAULT: fault,
    "chunk_prefill": chunk_prefill, "release_row": release_row,
}
"""Each action's function by name."""


def is_final(s: State) -> bool:
    """Everything is over: every request closed, nothing in flight, every written slot and every
    state row back."""
    return (
        s.allocated
        and not s.queue
        and all(r.status in CLOSED for r in s.requests)
        and all(slot.content is None or slot.released for slot in s.slots)
        and all(row.owner < 0 for row in s.table)
    )

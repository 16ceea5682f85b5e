"""Trace validation: a run's recorded events checked one by one as transitions of the model.

It needs the model and the recorded events only (`itf.read_events` reads a file of them): not
the runner, not the emulator.

No exploration: from the initial state, each event (`impl.events.Event`) must be an action the
model enables in the current state, what the runner decided with it must be what the model
decides (the previous-row map, partial rows and the slot of a schedule, the requests an apply
delivered to), and what the runner's state showed when it recorded the event must be what the
model's action leaves (the step's phase, the tokens a request holds): a recorded event means
its action happened. The model's next state is then the current one. A run of any length
validates in time linear in its events: a closed request's model index is recycled once nothing
names it, so the model state holds only the run's live requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ttmirror.conformance.traces.itf import EventsError
from ttmirror.impl.events import Event
from ttmirror.model.actions import (
    ALL_ACTIONS,
    FAULT,
    READ_RELEASED,
    RELEASE_ROW,
    REWRITE_WITH_READER,
    Action,
    successors,
    take,
)
from ttmirror.model.invariants import invariants_for
from ttmirror.model.state import CLOSED, Bounds, State, initial_state


@dataclass(frozen=True)
class Divergence:
    """Where a run left the model: the event, the model state before it, and why."""

    index: int
    event: Event
    state: State
    reason: str
    allowed: tuple[str, ...]
    """The labels of the actions the model enabled instead."""

    def line(self) -> str:
        """One line: which event left the model, and why."""
        return (f"the run left the model at event {self.index + 1} "
                f"({self.event.action}{self.event.args}): {self.reason}")


STEP_PHASES = ("combine", "launch", "readback_issue", "readback_complete")
"""The step phases whose events carry the step's phase as the runner's state showed it."""


def _happened(event: Event, before: State, after: State, ids: _Requests) -> str | None:
    """Why the runner's state, as the event recorded it, shows that its action did not happen
    (None: it did): a step phase's step is in the phase the model's action leaves it in; a fault
    names the phase the model's step was in; an apply's requests hold as many tokens as the
    model's. An event recorded before its device call (one that then failed) says otherwise."""
    if event.action in STEP_PHASES:
        want = after.queue[event.args[0]].phase.name.lower()
        if event.get("phase") != want:
            return (f"the runner's step was {event.get('phase')} when it recorded "
                    f"{event.action}, the model's is {want}: recorded before it happened")
    if event.action == FAULT:
        want = before.queue[event.args[0]].phase.name.lower()
        if event.get("phase") != want:
            return f"the failed step was {event.get('phase')} in the runner, {want} in the model"
    if event.action == "apply":
        for req, count in event.get("counts", ()):
            idx = ids.index.get(req)
            held = None if idx is None else len(after.requests[idx].delivered)
            if count != held:
                return (f"request {req} holds {count} tokens after the apply in the runner, "
                        f"{held} in the model")
    return None


def _decided(event: Event, before: State, after: State, ids: _Requests, b: Bounds
             ) -> str | None:
    """Why what the runner decided with `event` is not what the model decided (None: same):
    a schedule's slot and its rows' positions, previous-row map, partial flags and (with
    drafts) scheduled drafts; the host positions a combine staged; who an apply delivered to;
    who a fault failed. With drafts a row's position is the host's only for a host row (the
    model's `placed`); a mirror row's is on the device (-1 in both)."""
    if event.action == FAULT:
        got = tuple(sorted(ids.index.get(r, -1) for r in event.get("failed", ())))
        to = tuple(r for r, (a, b) in enumerate(zip(before.requests, after.requests, strict=True))
                   if b.status != a.status)
        if got != to:
            return f"the runner failed requests {event.get('failed')}, the model {to}"
    if event.action == "apply":
        delivered = event.get("delivered", ())
        got = tuple(sorted(ids.index.get(r, -1) for r, _ in delivered))
        to = _delivered(before, after)
        if got != to:
            return f"the runner delivered to {delivered}, the model to {to}"
    if event.action == "combine":
        step = after.queue[event.args[0]]
        host = tuple((row.placed if b.spec_tokens else row.pos)
                     if row.live and row.prev_row is None else None for row in step.rows)
        staged = tuple(row.host_pos for row in event.get("rows"))
        if staged != host:
            return (f"the runner staged the host ids of positions {staged}, "
                    f"the model's rows read positions {host}")
    if event.action == "schedule":
        step, rows = after.queue[-1], event.get("rows")
        positions = tuple(r.pos if r.placed is None or r.prev_row is not None else r.placed
                          for r in step.rows)
        decided = {  # what the runner decided for the step, beside the model's decision
            "slot": (event.get("slot"), step.slot),
            "positions": (tuple(r.pos for r in rows), positions),
            "prev_rows": (tuple(r.prev_row for r in rows), tuple(r.prev_row for r in step.rows)),
            "partial": (tuple(r.partial for r in rows), tuple(r.partial for r in step.rows)),
            "drafts scheduled": (tuple(r.spec for r in rows), tuple(r.spec for r in step.rows)),
            "idx_mapping": (tuple(r.idx for r in rows), tuple(r.idx for r in step.rows)),
        }
        for name, (got, want) in decided.items():
            if got != want:
                return f"the runner's {name} is {got}, the model's {want}"
    return None


NEWEST = "NewestTokenInNewestStep"
"""Reads the queue's live rows and who is eligible: whatever adds or retires a step, drops rows
or changes a status can falsify it."""
ROWS_NEWEST = "NewestTokenInStateRow"
"""With state rows: reads the table and the in-flight rows (checked where `NEWEST` is, and after
every launch, which writes the table)."""
CHECKED_AFTER: dict[str, tuple[str, ...]] = {
    "arrive": ("StateRowsOwned",),
    "schedule": ("DepthBound", NEWEST, ROWS_NEWEST),
    "combine": ("StaleHostIdsGuard", READ_RELEASED),
    "launch": (REWRITE_WITH_READER, "NoWriteToUnheldStateRow", ROWS_NEWEST),
    "readback_complete": (READ_RELEASED,),
    "apply": ("OutputIntegrity", NEWEST, ROWS_NEWEST),
    "finish": ("OutputIntegrity", NEWEST, ROWS_NEWEST),
    "abort": ("OutputIntegrity", NEWEST, ROWS_NEWEST),
    "preempt": (NEWEST, ROWS_NEWEST),
    FAULT: ("FailedRequestsQuiet", "OutputIntegrity", NEWEST, ROWS_NEWEST),
    "release_row": ("StateRowsOwned",),
}
"""The invariants each action can falsify (the others read nothing it writes): checking only
those keeps validation linear and cheap."""


def _broken(action: str, s: State, b: Bounds) -> str | None:
    """Which of the model's invariants the state after `action` breaks (None: none): an enabled
    transition can still be unsafe (a read of a handed-back slot, a stale id consumed)."""
    names = CHECKED_AFTER.get(action, ())
    broken = [inv.name for inv in invariants_for(b) if inv.name in names and not inv.holds(s, b)]
    return f"the model's invariant {', '.join(broken)} fails after it" if broken else None


def _delivered(before: State, after: State) -> tuple[int, ...]:
    """The model indices an apply delivered a token to."""
    return tuple(r for r, (a, b) in enumerate(zip(before.requests, after.requests, strict=True))
                 if len(b.delivered) > len(a.delivered))


def _mentions(s: State, idx: int) -> bool:
    """Does anything in flight, in a slot or in the state-row table still name request `idx` (a
    row, a token, a state row it holds)?"""
    if any(row.owner == idx for row in s.table):
        return True
    for step in s.queue:
        if any(row.req == idx or (row.consumed or (None,))[0] == idx for row in step.rows):
            return True
        if step.host_copy and any(t[0] == idx for t in step.host_copy):
            return True
    return any(slot.content and any(t[0] == idx for t in slot.content) for slot in s.slots)


DEVICE_EVENTS = ("device_wait", "host_read")
"""What a mirror on a device reports beside the model's actions: the host waited on a slot's
readback event, the host read the slot's host copy (`MirrorSpec.report`)."""


class _Copies:
    """Each slot's readback copy as the host saw it: issued, its event waited on, then read. The
    model's readback_complete is that wait and that read, in that order; a run whose allocate
    says its mirror reports device waits must show them."""

    def __init__(self) -> None:
        self.required = False
        self.seen: dict[int, str] = {}

    def device(self, event: Event) -> str | None:
        slot = event.args[0]
        now = self.seen.get(slot)
        if event.action == "device_wait":
            if now != "issued":
                return f"the host waited on slot {slot}'s readback event with no copy in flight"
            self.seen[slot] = "waited"
        else:
            if now != "waited":
                return (f"the host read slot {slot}'s host copy before waiting on its readback "
                        "event (it may hold what was there before the copy)")
            self.seen[slot] = "read"
        return None

    def complete(self, slot: int) -> str | None:
        if self.required and self.seen.get(slot) != "read":
            return (f"the readback of slot {slot} completed, but the device reported no wait "
                    "on its event and read after it")
        self.seen.pop(slot, None)
        return None


class _Requests:
    """Trace request ids onto model indices. A request that closed and that nothing in flight or
    in a slot still names can take no part in any later transition, so its index is recycled
    for the next arrival: the model state stays as small as the run's live requests, whatever
    the run's length (each index's budget and host-sync flag follow its current request)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.budgets: list[int] = []
        self.host_sync: set[int] = set()

    def arrive(self, s: State, b: Bounds, req: int, event: Event) -> tuple[State, Bounds, int]:
        free = next((i for i, r in enumerate(s.requests)
                     if r.status in CLOSED and i not in self.index.values()
                     and not _mentions(s, i)), None)
        fresh = initial_state(b._replace(requests=1)).requests[0]
        if free is None:
            free = len(s.requests)
            s = s._replace(requests=(*s.requests, fresh))
            self.budgets.append(0)
        else:
            s = s._replace(requests=tuple(fresh if i == free else r
                                          for i, r in enumerate(s.requests)))
        self.budgets[free] = int(event.get("max_tokens", b.max_tokens))
        (self.host_sync.add if event.get("host_sync") else self.host_sync.discard)(free)
        self.index[req] = free
        b = b._replace(requests=len(s.requests), max_tokens_of=tuple(self.budgets),
                       host_sync_of=tuple(sorted(self.host_sync)),
                       host_sync=bool(self.host_sync))
        return s, b, free

    def close(self, s: State) -> None:
        """Forget the trace ids of closed requests (their indices may be recycled)."""
        for req, i in list(self.index.items()):
            if s.requests[i].status in CLOSED:
                del self.index[req]

    def of(self, req: int) -> int:
        if req not in self.index:
            raise KeyError(req)
        return self.index[req]


PROGRESS_EVERY = 20_000
"""Events between two calls of `validate`'s progress callback."""


def validate(events: Iterable[Event], bounds: Bounds,
             progress: Callable[[int], None] | None = None) -> Divergence | None:
    """The first event where the run leaves the model, or None if every event is a model
    transition and every decision the model's. `bounds` gives the depth, slots and options;
    requests, their budgets and host-sync flags come from the run's arrivals, and preemptions
    per request and per-step chunks are bounds of exploration, not rules of the protocol, so
    they follow the run. The events are read once, in order (a stream will do); `progress` is
    called with the count so far every `PROGRESS_EVERY` events."""
    b = bounds._replace(requests=0, max_tokens_of=(), host_sync_of=(), host_sync=False)
    s = initial_state(b)
    ids = _Requests()
    copies = _Copies()
    for i, event in enumerate(_with_verdicts(events) if b.spec_tokens else events):
        if progress is not None and i and i % PROGRESS_EVERY == 0:
            progress(i)
        if event.action in ("release", *DEVICE_EVENTS) and event.args[0] >= b.slots:
            return Divergence(i, event, s, f"there is no slot {event.args[0]} (K={b.slots})", ())
        if event.action == RELEASE_ROW and event.args[0] >= len(s.table):
            return Divergence(i, event, s, f"there is no state row {event.args[0]} "
                              f"({len(s.table)})", ())
        if event.action in DEVICE_EVENTS:
            why = copies.device(event)
            if why is not None:
                return Divergence(i, event, s, why, ())
            continue
        if event.action == "refuse":  # refused before it arrived: no model transition
            if event.args[0] in ids.index:
                return Divergence(i, event, s, f"request {event.args[0]} is refused after it "
                                  "arrived (an arrived request is aborted)", ())
            continue
        if event.action == "allocate":
            copies.required = bool(event.get("device_waits"))
        try:
            if event.action == "arrive":
                s, b, idx = ids.arrive(s, b, event.args[0], event)
                args: tuple[int, ...] = (idx,)
            elif event.action == "schedule":
                args = tuple(ids.of(r) for r in event.args)
            elif event.action in ("finish", "abort", "preempt", "resume", "chunk_prefill"):
                args = (ids.of(event.args[0]), *event.args[1:])
            elif event.action == "launch" and b.spec_tokens:
                args = (*event.args, *_verdict(s, event))
            else:
                args = event.args
        except KeyError as e:
            return Divergence(i, event, s, f"request {e.args[0]} has not arrived (or closed)", ())
        if event.action == "preempt" and args[0] < len(s.requests):
            b = b._replace(preemptions=max(b.preemptions, s.requests[args[0]].preemptions + 1))
        if event.action == "chunk_prefill":
            b = b._replace(chunk_per_step=True)
        if event.action == FAULT:  # rule 12: a run that met a device fault
            b = b._replace(faults=True)
        known = event.action in (*ALL_ACTIONS, FAULT, "chunk_prefill", RELEASE_ROW)
        drafts: tuple[int, ...] = ()
        if event.action == "schedule" and b.subsets and b.spec_tokens:
            drafts = tuple(r.spec for r in event.get("rows"))  # the scheduler's choice
        action = Action(event.action, args, drafts)
        after = take(s, b, action) if known else None
        if after is None:
            allowed = tuple(a.label() for a, _ in successors(s, b))
            reason = "not enabled in this state" if known else "not a model action"
            return Divergence(i, event, s, reason, allowed)
        why = (_decided(event, s, after, ids, b) or _happened(event, s, after, ids)
               or _broken(event.action, after, b))
        if why is None and event.action == "readback_issue":
            copies.seen[s.queue[args[0]].slot] = "issued"
        if why is None and event.action == "readback_complete":
            why = copies.complete(s.queue[args[0]].slot)
        if why is None and event.action == FAULT:
            copies.seen.pop(s.queue[args[0]].slot, None)  # its copy, if any, was given up
        if why is not None:
            return Divergence(i, event, s, why, ())
        s = after
        if event.action in ("apply", "finish", "abort", FAULT):
            ids.close(s)
    return None


# --- speculative decoding: the launch's verdict, known at its readback -------------------------


def _verdict(s: State, event: Event) -> tuple[int, ...]:
    """The model's launch arguments past q (spec rule 13): per row the drafts its verification
    accepted, count - 1 from what the step's readback brought back (`_with_verdicts`), for every
    row the model has live and past its prompt; 0 for the others (dropped or partial rows: the
    model computes nothing of theirs), and for all when no readback completed (a failed step:
    nothing of it is delivered or read)."""
    q, counts = event.args[0], event.get("counts")
    if q >= len(s.queue):
        return ()  # no such step: the launch is not enabled, whatever its verdict
    rows = s.queue[q].rows
    if counts is None or len(counts) != len(rows):
        return (0,) * len(rows)
    return tuple(c - 1 if row.live and not row.partial else 0
                 for row, c in zip(rows, counts, strict=True))


def _with_verdicts(events: Iterable[Event]) -> Iterator[Event]:
    """The events in order, each launch with its step's recorded counts (the readback's
    `counts`): the model decides a launch's verdict when it happens, the host learns it at the
    step's readback, a few events on. A launch is held, with the events after it, until that
    readback (or the step's fault, or the run's end); the step is followed by its place in the
    queue (schedules join it, applies and faults leave it), so memory stays bounded by the
    events of two steps in flight."""
    held: deque[Event] = deque()
    waiting: dict[int, int] = {}  # step -> index in `held` of its launch (counted from `base`)
    base = 0  # events released so far
    queue: list[int] = []
    steps = 0
    for event in events:
        q = event.args[0] if event.args else -1
        index = base + len(held)
        if event.action == "schedule":
            queue.append(steps)
            steps += 1
        elif event.action == "launch" and 0 <= q < len(queue):
            waiting[queue[q]] = index
        elif event.action == "readback_complete" and 0 <= q < len(queue) and (
                queue[q] in waiting):
            at = waiting.pop(queue[q]) - base
            launch = held[at]
            held[at] = launch._replace(
                detail=(*launch.detail, ("counts", event.get("counts"))))
        elif event.action == "apply" and queue:
            queue.pop(0)
        elif event.action == FAULT and 0 <= q < len(queue):
            waiting.pop(queue.pop(q), None)  # never read back: nothing of it is delivered
        held.append(event)
        first = min(waiting.values(), default=base + len(held))
        while base < first:
            yield held.popleft()
            base += 1
    yield from held


# --- what a recorded run is an instance of ---------------------------------------------------


def bounds_of(events: Sequence[Event] | Event) -> Bounds:
    """The model instance a recorded run belongs to: the runner's depth, slots and options, from
    its allocate (the run's first event, or the run); requests, budgets, host-sync flags,
    preemptions and per-step chunks follow the run as it validates (`validate`)."""
    load = events if isinstance(events, Event) else (events[0] if events else None)
    if load is None or load.action != "allocate":
        raise EventsError("the run does not start with allocate (the ring is allocated at load)")
    depth, slots, chunks, spec, state_rows = (int(load.get(k, 0)) for k in (
        "depth", "slots", "prefill_chunks", "spec_tokens", "state_rows"))
    policy, state = str(load.get("preempt_policy")), str(load.get("state", "ring"))
    if not (1 <= depth <= 4 and 1 <= slots <= 64 and 1 <= chunks <= 1024
            and policy in ("keep", "drop") and 0 <= spec <= 4 and state in ("ring", "rows")
            and (state == "rows") == (1 <= state_rows <= 4096)):
        raise EventsError(f"the allocate (depth {depth}, K={slots}, prefill chunks {chunks}, "
                          f"preempt policy {policy!r}, spec tokens {spec}, state {state!r} "
                          f"with {state_rows} state rows) is no instance of this model (depth 1 "
                          "to 4, K and chunks 1 or more, policy keep or drop, spec tokens 0 to "
                          "4, state ring, or rows with 1 to 4096 state rows)")
    return Bounds(depth=depth, slots=slots, preemptions=0, guard=bool(load.get("guard")),
                  preempt_policy=policy, prefill_chunks=chunks, spec_tokens=spec,
                  subsets=bool(load.get("subsets")), state=state, state_rows=state_rows)

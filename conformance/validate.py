"""Trace validation: a run's recorded events checked one by one as transitions of the model.

No exploration: from the initial state, each event (`impl.events.Event`) must be an action the
model enables in the current state, and what the runner decided with it must be what the model
decides (the previous-row map, partial rows and the slot of a schedule, the requests an apply
delivered to); the model's next state is then the current one. A run of any length validates in
time linear in its events: a closed request's model index is recycled once nothing names it, so
the model state holds only the run's live requests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..impl.events import Event
from ..model.actions import (
    ALL_ACTIONS,
    FAULT,
    READ_RELEASED,
    REWRITE_WITH_READER,
    Action,
    successors,
)
from ..model.invariants import INVARIANTS
from ..model.state import CLOSED, Bounds, State, initial_state
from .lockstep import model_step


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


def _decided(event: Event, before: State, after: State, ids: _Requests) -> str | None:
    """Why what the runner decided with `event` is not what the model decided (None: same):
    a schedule's slot, previous-row map and partial rows; who an apply delivered to; who a
    fault failed."""
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
    if event.action == "combine" and event.get("host_pos") is not None:
        step = after.queue[event.args[0]]
        host = tuple(row.pos if row.live and row.prev_row is None else None for row in step.rows)
        if event.get("host_pos") != host:
            return (f"the runner staged the host ids of positions {event.get('host_pos')}, "
                    f"the model's rows read positions {host}")
    if event.action == "schedule":
        step = after.queue[-1]
        want = {
            "slot": step.slot,
            "prev_rows": tuple(row.prev_row for row in step.rows),
            "partial": tuple(row.partial for row in step.rows),
        }
        for name, value in want.items():
            if event.get(name) != value:
                return f"the runner's {name} is {event.get(name)}, the model's {value}"
    return None


NEWEST = "NewestTokenInNewestStep"
"""Reads the queue's live rows and who is eligible: whatever adds or retires a step, drops rows
or changes a status can falsify it."""
CHECKED_AFTER: dict[str, tuple[str, ...]] = {
    "schedule": ("DepthBound", NEWEST),
    "combine": ("StaleHostIdsGuard", READ_RELEASED),
    "launch": (REWRITE_WITH_READER,),
    "readback_complete": (READ_RELEASED,),
    "apply": ("OutputIntegrity", NEWEST),
    "finish": ("OutputIntegrity", NEWEST),
    "abort": ("OutputIntegrity", NEWEST),
    "preempt": (NEWEST,),
    FAULT: ("FailedRequestsQuiet", "OutputIntegrity", NEWEST),
}
"""The invariants each action can falsify (the others read nothing it writes): checking only
those keeps validation linear and cheap."""


def _broken(action: str, s: State, b: Bounds) -> str | None:
    """Which of the model's invariants the state after `action` breaks (None: none): an enabled
    transition can still be unsafe (a read of a handed-back slot, a stale id consumed)."""
    names = CHECKED_AFTER.get(action, ())
    broken = [inv.name for inv in INVARIANTS if inv.name in names and not inv.holds(s, b)]
    return f"the model's invariant {', '.join(broken)} fails after it" if broken else None


def _delivered(before: State, after: State) -> tuple[int, ...]:
    """The model indices an apply delivered a token to."""
    return tuple(r for r, (a, b) in enumerate(zip(before.requests, after.requests, strict=True))
                 if len(b.delivered) > len(a.delivered))


def _mentions(s: State, idx: int) -> bool:
    """Does anything in flight or in a slot still name request `idx` (a row, a token)?"""
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
    for i, event in enumerate(events):
        if progress is not None and i and i % PROGRESS_EVERY == 0:
            progress(i)
        if event.action in ("release", *DEVICE_EVENTS) and event.args[0] >= b.slots:
            return Divergence(i, event, s, f"there is no slot {event.args[0]} (K={b.slots})", ())
        if event.action in DEVICE_EVENTS:
            why = copies.device(event)
            if why is not None:
                return Divergence(i, event, s, why, ())
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
        known = event.action in (*ALL_ACTIONS, FAULT, "chunk_prefill")
        action = Action(event.action, args)
        after = model_step(s, b, action) if known else None
        if after is None:
            allowed = tuple(a.label() for a, _ in successors(s, b))
            reason = "not enabled in this state" if known else "not a model action"
            return Divergence(i, event, s, reason, allowed)
        why = _decided(event, s, after, ids) or _broken(event.action, after, b)
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


# --- what a recorded run is an instance of, and its file ----------------------------------------

FORMAT = "ttmirror-events"
VERSION = 1


class EventsError(ValueError):
    """The file or the events are not a recorded run this model can check (one line)."""


def bounds_of(events: Sequence[Event] | Event) -> Bounds:
    """The model instance a recorded run belongs to: the runner's depth, slots and options, from
    its allocate (the run's first event, or the run); requests, budgets, host-sync flags,
    preemptions and per-step chunks follow the run as it validates (`validate`)."""
    load = events if isinstance(events, Event) else (events[0] if events else None)
    if load is None or load.action != "allocate":
        raise EventsError("the run does not start with allocate (the ring is allocated at load)")
    depth, slots, chunks = (int(load.get(k, 0)) for k in ("depth", "slots", "prefill_chunks"))
    policy = str(load.get("preempt_policy"))
    if not (1 <= depth <= 2 and 1 <= slots <= 64 and 1 <= chunks <= 1024
            and policy in ("keep", "drop")):
        raise EventsError(f"the allocate (depth {depth}, K={slots}, prefill chunks {chunks}, "
                          f"preempt policy {policy!r}) is no instance of this model (depth 1 or "
                          "2, K and chunks 1 or more, policy keep or drop)")
    return Bounds(depth=depth, slots=slots, preemptions=0, guard=bool(load.get("guard")),
                  preempt_policy=policy, prefill_chunks=chunks)


def _encode(value: object) -> object:
    if value is None:
        return {"tag": "None", "value": {"#tup": []}}
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, tuple | list):
        return {"#tup": [_encode(v) for v in value]}
    raise EventsError(f"cannot encode {value!r} in a trace")


def _decode(value: object) -> object:
    if isinstance(value, dict) and "#tup" in value:
        return tuple(_decode(v) for v in value["#tup"])
    if isinstance(value, dict) and value.get("tag") == "None":
        return None
    if isinstance(value, bool | int | str):
        return value
    raise EventsError(f"unexpected value {value!r}")


_META = {"format": "ITF", "ttmirror": {"format": FORMAT, "version": VERSION}}
_VARS = ["mbt::actionTaken", "mbt::nondetPicks"]
_OPEN = ', "states": ['
"""How `write_itf`'s first line ends: the states follow, one per line."""


def _state(i: int, e: Event) -> dict[str, object]:
    return {"#meta": {"index": i}, "mbt::actionTaken": e.action,
            "mbt::nondetPicks": {"args": _encode(e.args), **{k: _encode(v) for k, v in e.detail}}}


LARGEST = 2**31 - 1
"""No id, count or index of a recorded run is larger (a larger one is a malformed trace)."""
_INT, _BOOL, _STR = "int", "bool", "str"
_POS = ("tuple", "int?")  # a tuple of ints or None, one per row
_SCHEMA: dict[str, tuple[int | None, dict[str, Any], frozenset[str]]] = {
    # action: (arguments (None: one or more), detail name -> type, optional details)
    "allocate": (0, {"depth": _INT, "slots": _INT, "guard": _BOOL, "preempt_policy": _STR,
                     "prefill_chunks": _INT, "device_waits": _BOOL}, frozenset({"device_waits"})),
    "arrive": (1, {"prompt": _INT, "max_tokens": _INT, "host_sync": _BOOL,
                   "prefill_chunks": _INT}, frozenset()),
    "schedule": (None, {"slot": _INT, "prev_rows": _POS, "partial": ("tuple", _BOOL)},
                 frozenset()),
    "combine": (1, {"host_pos": _POS}, frozenset({"host_pos"})),
    "launch": (1, {}, frozenset()),
    "readback_issue": (1, {}, frozenset()),
    "readback_complete": (1, {}, frozenset()),
    "apply": (0, {"step": _INT, "delivered": ("tuple", ("pair", _INT))}, frozenset()),
    "release": (1, {}, frozenset()),
    "finish": (1, {}, frozenset()),
    "abort": (1, {}, frozenset()),
    "preempt": (1, {}, frozenset()),
    "resume": (1, {}, frozenset()),
    "chunk_prefill": (2, {}, frozenset()),
    FAULT: (1, {"phase": _STR, "failed": ("tuple", _INT)}, frozenset()),
    "device_wait": (1, {}, frozenset()),
    "host_read": (1, {}, frozenset()),
}
"""What a recorded event may hold: anything else is a malformed trace, not a divergence."""


def _typed(value: object, kind: Any) -> bool:
    """Is `value` of the schema type `kind`?"""
    if kind == _INT:
        return type(value) is int and 0 <= value <= LARGEST
    if kind == "int?":
        return value is None or _typed(value, _INT)
    if kind == _BOOL:
        return type(value) is bool
    if kind == _STR:
        return type(value) is str
    if isinstance(kind, tuple) and kind[0] == "pair":
        return (isinstance(value, tuple) and len(value) == 2
                and all(_typed(v, kind[1]) for v in value))
    if isinstance(kind, tuple) and kind[0] == "tuple":
        return isinstance(value, tuple) and all(_typed(v, kind[1]) for v in value)
    return False


def _event(i: int, state: object) -> Event:
    """State `i` of a trace as an event, checked against `_SCHEMA` (EventsError: one line)."""
    try:
        if not isinstance(state, dict):
            raise TypeError("not an object")
        action = state["mbt::actionTaken"]
        picks = dict(state["mbt::nondetPicks"])
        args = _decode(picks.pop("args"))
        detail = {k: _decode(v) for k, v in picks.items()}
    except (KeyError, TypeError, ValueError, AttributeError, EventsError) as e:
        raise EventsError(f"state {i} is not an event ({type(e).__name__}: {e})") from None
    if not isinstance(action, str) or action not in _SCHEMA:
        raise EventsError(f"state {i}: {action!r} is no action of a recorded run "
                          f"({', '.join(_SCHEMA)})")
    count, fields, optional = _SCHEMA[action]
    if not isinstance(args, tuple) or not all(_typed(a, _INT) for a in args) or (
            len(args) != count if count is not None else not args):
        raise EventsError(f"state {i}: {action} takes "
                          f"{'one or more' if count is None else count} arguments, integers in "
                          f"[0, 2**31), not {args!r}")
    for name, value in detail.items():
        if name not in fields or not _typed(value, fields[name]):
            raise EventsError(f"state {i}: {action}'s {name} = {value!r} is not "
                              f"{fields.get(name, 'one of its details')}")
    missing = set(fields) - set(detail) - optional
    if missing:
        raise EventsError(f"state {i}: {action} lacks {', '.join(sorted(missing))}")
    if action == "chunk_prefill" and args[1] > 1:
        raise EventsError(f"state {i}: chunk_prefill's second argument is 0 or 1, not {args[1]}")
    if action == "schedule" and any(len(detail[k]) != len(args)  # type: ignore[arg-type]
                                    for k in ("prev_rows", "partial")):
        raise EventsError(f"state {i}: schedule's prev_rows and partial need one entry per row")
    return Event(action, args, tuple(detail.items()))


def _check_meta(data: object) -> None:
    meta = data.get("#meta") if isinstance(data, dict) else None
    ours = meta.get("ttmirror") if isinstance(meta, dict) else None
    if not isinstance(ours, dict) or (ours.get("format"), ours.get("version")) != (FORMAT,
                                                                                   VERSION):
        raise EventsError(f"not a recorded run ({FORMAT} v{VERSION}); a regression trace of "
                          "the lockstep replays with `ttmirror replay`")


def write_itf(events: Iterable[Event], path: str | os.PathLike[str]) -> int:
    """Write the run as an ITF trace of Quint's model-based-testing variables, one state per
    event and one per line (still one JSON document), so `read_itf` can stream it back without
    holding it whole; returns the number of events written."""
    n = 0
    with open(path, "w") as f:
        f.write(json.dumps({"#meta": _META, "vars": _VARS})[:-1] + _OPEN + "\n")
        for i, e in enumerate(events):
            f.write(("," if i else "") + json.dumps(_state(i, e)) + "\n")
            n += 1
        f.write("]}\n")
    return n


def read_itf(path: str | os.PathLike[str]) -> Iterator[Event]:
    """The events of a trace file, streamed when it has `write_itf`'s one-state-per-line layout
    (else read whole, as `from_itf`). EventsError (one line) where it stops being a trace: a
    truncated file fails at its end, after the events before it were yielded."""
    with open(path) as f:
        head = f.readline()
        if not head.rstrip().endswith(_OPEN):
            try:
                data = json.loads(head + f.read())
            except json.JSONDecodeError as e:
                raise EventsError(f"not JSON (truncated?): {e.msg} at line {e.lineno}") from None
            yield from from_itf(data)
            return
        try:
            meta = json.loads(head.rstrip()[: -len(_OPEN)] + "}")
        except json.JSONDecodeError as e:
            raise EventsError(f"not JSON: {e.msg} in its first line") from None
        _check_meta(meta)
        i, closed = 0, False
        for lineno, line in enumerate(f, start=2):
            text = line.strip()
            if text == "]}":
                closed = True
                break
            try:
                state = json.loads(text.removeprefix(","))
            except json.JSONDecodeError as e:
                raise EventsError(f"not JSON (truncated?): {e.msg} at line {lineno}") from None
            yield _event(i, state)
            i += 1
        if not closed:
            raise EventsError(f"the trace ends after {i} events, unclosed (truncated?)")
        if i == 0:
            raise EventsError("the trace has no events")


def from_itf(data: object) -> list[Event]:
    """The events of a trace read whole (one JSON document, in any layout); EventsError (one
    line) if it is not a recorded run."""
    if not isinstance(data, dict):
        raise EventsError("not an ITF trace (a JSON object with states)")
    _check_meta(data)
    out = [_event(i, state) for i, state in enumerate(data.get("states") or [])]
    if not out:
        raise EventsError("the trace has no events")
    return out

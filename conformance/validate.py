"""Trace validation: a run's recorded events checked one by one as transitions of the model.

No exploration: from the initial state, each event (`impl.events.Event`) must be an action the
model enables in the current state, and what the runner decided with it must be what the model
decides (the previous-row map, partial rows and the slot of a schedule, the requests an apply
delivered to); the model's next state is then the current one. A run of any length validates in
time linear in its events, within the bounds the events fit (`Bounds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..impl.events import Event
from ..model.actions import ALL_ACTIONS, Action, chunk_prefill, successors
from ..model.state import Bounds, State, initial_state
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


def _decided(event: Event, before: State, after: State) -> str | None:
    """Why what the runner decided with `event` is not what the model decided (None: same)."""
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
    if event.action == "apply":
        got = tuple(req for req, _ in event.get("delivered", ()))
        want_reqs = tuple(sorted(
            r for r, (a, b) in enumerate(zip(before.requests, after.requests, strict=True))
            if len(b.delivered) > len(a.delivered)
        ))
        if got != want_reqs:
            return f"the runner delivered to {got}, the model to {want_reqs}"
    return None


def validate(events: Sequence[Event], bounds: Bounds) -> Divergence | None:
    """The first event where the run leaves the model, or None if every event is a model
    transition and every decision the model's."""
    s = initial_state(bounds)
    for i, event in enumerate(events):
        known = event.action in ALL_ACTIONS or event.action == "chunk_prefill"
        action = Action(event.action, event.args)
        if event.action == "chunk_prefill":  # rule 11: not explored, only validated
            after = chunk_prefill(s, bounds, *event.args) if known else None
        else:
            after = model_step(s, bounds, action) if known else None
        if after is None:
            allowed = tuple(a.label() for a, _ in successors(s, bounds))
            reason = "not enabled in this state" if known else "not a model action"
            return Divergence(i, event, s, reason, allowed)
        why = _decided(event, s, after)
        if why is not None:
            return Divergence(i, event, s, why, ())
        s = after
    return None



# --- what a recorded run is an instance of, and its file ----------------------------------------

FORMAT = "ttmirror-events"
VERSION = 1


class EventsError(ValueError):
    """The file or the events are not a recorded run this model can check (one line)."""


def bounds_of(events: Sequence[Event]) -> Bounds:
    """The model instance a recorded run belongs to: the runner's depth, slots and options from
    its allocate, one request per arrive (ids 0..n-1) with its own budget and host-sync flag,
    as many preemptions as the run made, and chunks sized per step if it sized any."""
    if not events or events[0].action != "allocate":
        raise EventsError("the run does not start with allocate (the ring is allocated at load)")
    load = events[0]
    budgets: dict[int, int] = {}
    preempts: dict[int, int] = {}
    for e in events:
        if e.action == "arrive":
            budgets[e.args[0]] = int(e.get("max_tokens"))
        if e.action == "preempt":
            preempts[e.args[0]] = preempts.get(e.args[0], 0) + 1
    if sorted(budgets) != list(range(len(budgets))):
        raise EventsError(f"request ids {sorted(budgets)[:8]}... are not 0..n-1")
    host_sync = tuple(sorted(e.args[0] for e in events
                             if e.action == "arrive" and e.get("host_sync")))
    return Bounds(
        depth=int(load.get("depth")), slots=int(load.get("slots")), requests=len(budgets),
        max_tokens=max(budgets.values(), default=1), preemptions=max(preempts.values(), default=0),
        guard=bool(load.get("guard")), preempt_policy=str(load.get("preempt_policy")),
        prefill_chunks=int(load.get("prefill_chunks")), host_sync=bool(host_sync),
        max_tokens_of=tuple(budgets[r] for r in range(len(budgets))), host_sync_of=host_sync,
        chunk_per_step=any(e.action == "chunk_prefill" for e in events),
    )


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


def to_itf(events: Sequence[Event]) -> dict[str, object]:
    """The run as an ITF trace of Quint's model-based-testing variables, one state per event."""
    return {
        "#meta": {"format": "ITF", "ttmirror": {"format": FORMAT, "version": VERSION}},
        "vars": ["mbt::actionTaken", "mbt::nondetPicks"],
        "states": [
            {"#meta": {"index": i}, "mbt::actionTaken": e.action,
             "mbt::nondetPicks": {"args": _encode(e.args),
                                  **{k: _encode(v) for k, v in e.detail}}}
            for i, e in enumerate(events)
        ],
    }


def from_itf(data: object) -> list[Event]:
    """The events of a trace written by `to_itf`; EventsError (one line) if it is not one."""
    if not isinstance(data, dict):
        raise EventsError("not an ITF trace (a JSON object with states)")
    meta = data.get("#meta", {}).get("ttmirror", {}) if isinstance(data.get("#meta"), dict) else {}
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise EventsError(f"not a recorded run ({FORMAT} v{VERSION}); a regression trace of "
                          "the lockstep replays with `ttmirror replay`")
    out = []
    for i, state in enumerate(data.get("states") or []):
        try:
            picks = dict(state["mbt::nondetPicks"])
            args = _decode(picks.pop("args"))
            if not isinstance(args, tuple):
                raise TypeError(f"args {args!r} are not a tuple")
            out.append(Event(str(state["mbt::actionTaken"]), tuple(int(a) for a in args),
                             tuple((k, _decode(v)) for k, v in picks.items())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise EventsError(f"state {i} is not an event ({type(e).__name__}: {e})") from None
    if not out:
        raise EventsError("the trace has no events")
    return out

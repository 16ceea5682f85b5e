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
from ..model.actions import ALL_ACTIONS, Action, successors
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
        known = event.action in ALL_ACTIONS
        after = model_step(s, bounds, Action(event.action, event.args)) if known else None
        if after is None:
            allowed = tuple(a.label() for a, _ in successors(s, bounds))
            reason = "not enabled in this state" if known else "not a model action"
            return Divergence(i, event, s, reason, allowed)
        why = _decided(event, s, after)
        if why is not None:
            return Divergence(i, event, s, why, ())
        s = after
    return None


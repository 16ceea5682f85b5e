"""The runner's protocol events: each phase and request event as the model's action, recorded.

Every call the runner accepts appends one `Event`, named and parameterised as the model's
action it implements (`schedule` with its row order, `combine(q)`, `release(slot)`, ...), plus
what the runner decided that the model decides too (a schedule's slot and its rows, a combine's
rows with the host positions it staged: `rows.Row` records), so a checker can replay a run
against the model and compare those decisions, and what the runner's state shows of each step
phase once it is done (the step's phase, the slot's writer, how many tokens each request now
holds), so a checker can tell an event that happened from one recorded too early. A refused
call records nothing: an event recorded inside a device call that raised is forgotten
(`Runner.device_call`). `chunk_prefill`
(spec rule 11) is a model action that exploration never enables and validation does
(`Bounds.chunk_per_step`).

Recording is one tuple append per call (its cost is measured by `make bench-engine`).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Event(NamedTuple):
    action: str
    """The model's action name (or `chunk_prefill`)."""
    args: tuple[int, ...]
    """The model action's arguments: the row order for schedule, q for step phases, the request
    for request events, the slot for release, none for allocate and apply."""
    detail: tuple[tuple[str, Any], ...] = ()
    """What the runner decided or was told beside the arguments, as (name, value) pairs."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.detail).get(name, default)


class EventLog:
    """The events of one runner, in the order the runner accepted them."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.events: list[Event] = []

    def record(self, action: str, args: tuple[int, ...] = (), **detail: Any) -> None:
        if self.enabled:
            self.events.append(Event(action, args, tuple(detail.items())))

    def forget(self, count: int) -> None:
        """Drop the events after the first `count`: recorded inside a call that then raised."""
        del self.events[count:]

    def __len__(self) -> int:
        return len(self.events)

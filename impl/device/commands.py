"""What a command queue holds: commands, the events that order queues, and trace ids."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .allocator import Buffer
from .ordering import Clock

Body = Callable[[], None]


@dataclass(eq=False)
class Command:
    """One entry of a CQ. It completes only when the device is advanced past it."""

    id: int
    name: str
    cq: int
    index: int  # 1-based position on its CQ
    clock: Clock
    body: Body | None = None
    event: MeshEvent | None = None  # recorded by this command, or awaited by it
    waits: bool = False  # a wait_for_event barrier: ready only once `event` completed
    trace: int | None = None  # replayed from this trace
    writes: tuple[Buffer, ...] = ()
    """The buffers it writes when it completes (what an observer of the device may look at)."""
    done: bool = False
    not_before: float | None = None
    """A stalled command (an injected fault): not ready before this `time.monotonic()`."""
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = f"{self.name}#{self.id}"

    def ready(self) -> bool:
        if self.not_before is not None and time.monotonic() < self.not_before:
            return False
        return not self.waits or (self.event is not None and self.event.done)

    def __repr__(self) -> str:
        state = "done" if self.done else ("ready" if self.ready() else "blocked")
        return f"<{self.label} CQ{self.cq}[{self.index}] {state}>"


@dataclass(eq=False)
class MeshEvent:
    """Completion of everything enqueued on `cq` before `record_event`."""

    cq: int
    record: Command
    clock: Clock
    device: Any = None  # the EmulatedMeshDevice that recorded it

    @property
    def done(self) -> bool:
        return self.record.done

    def __repr__(self) -> str:
        return f"MeshEvent(cq={self.cq}, {self.record.label}, {'done' if self.done else 'pending'})"


@dataclass(frozen=True)
class MeshTraceId:
    id: int

    def __int__(self) -> int:
        return self.id


@dataclass(eq=False)
class Program:
    """A device op ready to enqueue: its name, the buffers it reads and writes, its effect."""

    name: str
    reads: tuple[Buffer, ...]
    writes: tuple[Buffer, ...]
    body: Body
    cache_key: object = None
    trace: int | None = field(default=None)

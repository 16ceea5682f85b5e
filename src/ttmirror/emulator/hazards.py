"""Hazard reports: what went wrong, on which buffers, commands and queues.

A hazard is a use of device memory or of a readback that the chip would not make safe: the
emulated device reports it instead of hiding it. In "raise" mode the offending call raises
`HazardError`; in "count" mode (soak runs) the hazard is only logged and counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

HazardMode = Literal["raise", "count"]


class HazardKind(StrEnum):
    USE_AFTER_FREE = "use-after-free"  # a command reads or writes a freed buffer
    READ_AFTER_WRITE = "read-after-write"  # cross-queue, no event orders the write before the read
    WRITE_AFTER_READ = "write-after-read"  # cross-queue, no event orders the read before the write
    WRITE_AFTER_WRITE = "write-after-write"  # cross-queue, no event orders the two writes
    UNSYNCHRONISED_READBACK = "unsynchronised-readback"  # host reads before the readback's event
    DROPPED_READBACK = "dropped-readback"  # host tensor of a pending readback dropped before sync
    TRACE_BUFFER_FREED = "trace-buffer-freed"  # a buffer an alive trace uses was deallocated
    TRACE_UNSAFE_ALLOCATION = "trace-unsafe-allocation"  # allocated after capture, alive at replay
    OVERLAPPING_ALLOCATION = "overlapping-allocation"  # a new buffer shares bytes with a live one


@dataclass(frozen=True)
class Hazard:
    kind: HazardKind
    message: str
    buffers: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    queues: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = []
        if self.buffers:
            where.append("buffers " + ", ".join(self.buffers))
        if self.commands:
            where.append("commands " + ", ".join(self.commands))
        if self.queues:
            where.append("queues " + ", ".join(f"CQ{q}" for q in self.queues))
        return f"[{self.kind}] {self.message}" + (f" ({'; '.join(where)})" if where else "")


class HazardError(Exception):
    """Raised for a hazard in "raise" mode; `.hazard` holds the structured report. Not a
    RuntimeError: a chip raises those for device faults, and a hazard is a bug of the caller,
    never a fault to recover from."""

    def __init__(self, hazard: Hazard) -> None:
        super().__init__(str(hazard))
        self.hazard = hazard


@dataclass
class HazardLog:
    """Every hazard seen, a counter per kind, and a deferred raise for hazards found off-call.

    Some hazards are found where raising is impossible (a weakref callback when the host drops a
    readback tensor); those are raised by the next call into the device.
    """

    mode: HazardMode = "raise"
    keep: int = 1000  # hazards kept in full; a soak run keeps counting past this
    hazards: list[Hazard] = field(default_factory=list)
    counts: Counter[HazardKind] = field(default_factory=Counter)
    _deferred: list[Hazard] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self, hazard: Hazard, *, can_raise: bool = True) -> None:
        with self._lock:
            if len(self.hazards) < self.keep:
                self.hazards.append(hazard)
            self.counts[hazard.kind] += 1
            if self.mode == "raise" and not can_raise:
                self._deferred.append(hazard)
        if self.mode == "raise" and can_raise:
            raise HazardError(hazard)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock is not state: a copy gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def raise_deferred(self) -> None:
        """Raise the first hazard found where it could not be raised, if any."""
        if not self._deferred:
            return
        with self._lock:
            hazard, self._deferred[:] = self._deferred[0], []
        raise HazardError(hazard)

    def take_deferred(self) -> list[Hazard]:
        """Hand over (and forget) the hazards waiting to be raised."""
        with self._lock:
            taken, self._deferred[:] = list(self._deferred), []
        return taken

    def of_kind(self, kind: HazardKind) -> list[Hazard]:
        return [h for h in self.hazards if h.kind == kind]

"""Happens-before across command queues, and the cross-queue data races it exposes.

Each CQ runs in order; nothing orders CQ0 against CQ1 except events (and the host, once it has
synchronised). Vector clocks record that order: `clock[q]` of a command is how many commands of
CQ q are known to complete before it starts. Every buffer keeps its latest accesses per queue;
an access that another queue's access is not ordered with is a read-after-write, write-after-read
or write-after-write hazard. The check runs at enqueue time, so it does not depend on how the
device happens to be scheduled: a race is reported even in a run where it did no harm.

A freed buffer's history stays with its bytes: a later buffer reusing them inherits it, because a
command still in flight on the other queue may touch those bytes (the allocator never waits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .allocator import Buffer
from .hazards import Hazard, HazardKind

Clock = tuple[int, ...]


@dataclass(frozen=True)
class Access:
    command: Any  # the Command (labels are only rendered when a race is reported)
    cq: int
    index: int  # 1-based position on its CQ
    buffer: Buffer


@dataclass
class History:
    writes: dict[int, Access] = field(default_factory=dict)
    reads: dict[int, Access] = field(default_factory=dict)

    def merge(self, other: History) -> None:
        for mine, theirs in ((self.writes, other.writes), (self.reads, other.reads)):
            for cq, access in theirs.items():
                if cq not in mine or mine[cq].index < access.index:
                    mine[cq] = access

    def covered_by(self, clock: Clock) -> bool:
        accesses = (*self.writes.values(), *self.reads.values())
        return all(clock[a.cq] >= a.index for a in accesses)


def _ordered(prior: Access, cq: int, clock: Clock) -> bool:
    return prior.cq == cq or clock[prior.cq] >= prior.index


def join(a: Clock | list[int], b: Clock | list[int]) -> list[int]:
    return [max(x, y) for x, y in zip(a, b, strict=True)]


class OrderingTracker:
    """Clocks of the queues and of the host, and the per-buffer access histories."""

    def __init__(self, num_cqs: int) -> None:
        self.num_cqs = num_cqs
        self.enqueued = [0] * num_cqs
        self._cq_clock = [[0] * num_cqs for _ in range(num_cqs)]
        self.host_clock: list[int] = [0] * num_cqs
        self._graveyard: list[tuple[int, int, History]] = []  # (address, size, history)

    # --- clocks ----------------------------------------------------------------------------------
    def stamp(self, cq: int) -> tuple[int, Clock]:
        """Position and clock for a command being enqueued on `cq`."""
        clock = join(self._cq_clock[cq], self.host_clock)  # enqueued after what the host knows
        index = self.enqueued[cq] + 1
        self.enqueued[cq] = index
        clock[cq] = index - 1
        stamped = tuple(clock)
        clock[cq] = index
        self._cq_clock[cq] = clock
        return index, stamped

    def wait(self, cq: int, event_clock: Clock) -> None:
        """Commands enqueued on `cq` after a wait_for_event know what the event covers."""
        self._cq_clock[cq] = join(self._cq_clock[cq], event_clock)

    def host_knows(self, clock: Clock) -> None:
        """The host has seen this clock complete (event_synchronize, blocking read)."""
        self.host_clock = join(self.host_clock, clock)

    def host_drains(self, cq: int) -> None:
        """The host has waited for everything enqueued on `cq` so far."""
        self.host_clock = join(self.host_clock, self._cq_clock[cq])
        self.host_clock[cq] = self.enqueued[cq]

    def host_has_seen(self, cq: int, index: int) -> bool:
        return self.host_clock[cq] >= index

    # --- accesses --------------------------------------------------------------------------------
    def access(
        self, buffer: Buffer, command: Any, cq: int, index: int, clock: Clock, *, write: bool
    ) -> list[Hazard]:
        history: History = buffer.history
        if history is None:
            history = buffer.history = History()
        me = Access(command, cq, index, buffer)
        hazards = []
        for prior in history.writes.values():
            if not _ordered(prior, cq, clock):
                kind = HazardKind.WRITE_AFTER_WRITE if write else HazardKind.READ_AFTER_WRITE
                hazards.append(_race(kind, prior, me))
        if write:
            for prior in history.reads.values():
                if not _ordered(prior, cq, clock):
                    hazards.append(_race(HazardKind.WRITE_AFTER_READ, prior, me))
            history.writes = {cq: me}
            history.reads = {}
        else:
            history.reads[cq] = me
        return hazards

    def retire(self, buffer: Buffer) -> None:
        """A freed buffer's history stays with its bytes until they are reused."""
        if buffer.history is not None and not buffer.history.covered_by(tuple(self.host_clock)):
            self._graveyard.append((buffer.address, buffer.size, buffer.history))

    def adopt(self, buffer: Buffer) -> None:
        """A new buffer inherits the histories of freed buffers whose bytes it reuses."""
        if not self._graveyard:
            return
        host = tuple(self.host_clock)
        keep = []
        for address, size, history in self._graveyard:
            if history.covered_by(host):
                continue  # the host has seen all of it complete: nothing can still race
            if buffer.overlaps(address, size):
                if buffer.history is None:
                    buffer.history = History()
                buffer.history.merge(history)
            else:
                keep.append((address, size, history))
        self._graveyard = keep


def _race(kind: HazardKind, prior: Access, me: Access) -> Hazard:
    what = "reads" if kind is HazardKind.READ_AFTER_WRITE else "writes"
    done = "read" if kind is HazardKind.WRITE_AFTER_READ else "written"
    mine, theirs = me.buffer.label, prior.buffer.label
    return Hazard(
        kind,
        f"{me.command.label} on CQ{me.cq} {what} {mine}, "
        f"{done} by {prior.command.label} on CQ{prior.cq} "
        f"({theirs}) with no event ordering the two",
        buffers=tuple(dict.fromkeys((mine, theirs))),
        commands=(prior.command.label, me.command.label),
        queues=(prior.cq, me.cq),
    )

"""The request table: every request the runner serves, its host record, and the state rows.

The one table of requests: the runner's pipeline (`runner.py`: steps, phases, the release rule)
reads and writes requests only through it, and so does a serving engine. A request is first
`submit`ted by its engine, with the engine's own record of it (`entries`: its prompt ids, stop
ids, sampling...), and waits there (`queued`) until it arrives in the runner (`admit`), with the
lowest free state row where the device keeps one per request (spec rule 14); it stays, closed
or not: a closed request's tokens are still the run's. The table also keeps which requests may
not be closed yet, so the per-step scans cost the same after a million requests as after ten.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .backend import TokenLogprobs


class Status(IntEnum):
    """Lifecycle of one request (the model's numbering)."""

    ABSENT = 0
    WAITING = 1  # arrived or resumed: its next step prefills from host ids
    RUNNING = 2
    PREEMPTED = 3
    FINISHED = 4
    ABORTED = 5
    FAILED = 6  # a step of it failed on the device: closed, with the device's error


CLOSED = frozenset({Status.FINISHED, Status.ABORTED, Status.FAILED})


@dataclass
class Request:
    """One request as the host knows it."""

    prompt: int
    max_tokens: int
    status: Status = Status.WAITING
    delivered: list[int] = field(default_factory=list)
    closed_at: int | None = None
    unchecked: bool = False
    preemptions: int = 0
    prefill_left: int = 0
    host_sync: bool = False
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    """One per delivered token, when the mirror has a logprob ring."""
    error: str | None = None
    placeholders: int = 0
    """With drafts: output placeholders owed, 1 + spec per scheduled row that will yield,
    drained at apply (vLLM's num_output_placeholders)."""
    drafts_ready: bool = False
    """With drafts: it was in the last scheduled step past its prompt, so the drafter proposed
    drafts after its newest token."""
    host_drafts: tuple[int, ...] = ()
    """With drafts: the drafts read back with its newest delivered token."""
    state_row: int = -1
    """With state rows: the state row it was given at arrival, held until released."""


class RequestTable(Mapping[int, Request]):
    """Request id -> its record, every request that arrived; and the state rows' owners."""

    def __init__(self, state_rows: int = 0) -> None:
        """`state_rows`: the device's per-request state rows (0: none, the ring)."""
        self._records: dict[int, Request] = {}
        self.entries: dict[int, Any] = {}
        """The engine's own record of each request it submitted, kept once it arrived."""
        self._queued: dict[int, None] = {}  # submitted, not arrived, in submission order
        self._open: set[int] = set()
        self.owners: list[int] = [-1] * state_rows
        """Each state row's owner (-1: free)."""

    def __getitem__(self, req: int) -> Request:
        return self._records[req]

    def __iter__(self) -> Iterator[int]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def submit(self, req: int, entry: Any) -> None:
        """An engine queues `req` with its own record of it; ValueError if it was already
        submitted or arrived."""
        if req in self.entries or req in self._records:
            raise ValueError(f"request {req} was already submitted")
        self.entries[req] = entry
        self._queued[req] = None

    def queued(self) -> list[int]:
        """Requests submitted and not arrived yet, in submission order."""
        return list(self._queued)

    def is_queued(self, req: int) -> bool:
        return req in self._queued

    def withdraw(self, req: int) -> bool:
        """A queued request leaves (aborted, or refused, before it arrived): False if it is not
        queued."""
        if req not in self._queued:
            return False
        del self._queued[req], self.entries[req]
        return True

    def free_row(self) -> int | None:
        """The lowest free state row (None: every one is held, or there are none)."""
        return next((i for i, owner in enumerate(self.owners) if owner < 0), None)

    def admit(self, req: int, record: Request) -> None:
        """`req` arrives with `record`, holding the state row the record names (if any)."""
        if record.state_row >= 0:
            self.owners[record.state_row] = req
        self._queued.pop(req, None)
        self._records[req] = record
        self._open.add(req)

    def release_row(self, idx: int) -> None:
        """State row `idx` goes back: its owner holds none, the next arrival may take it."""
        self._records[self.owners[idx]].state_row = -1
        self.owners[idx] = -1

    def open(self) -> list[int]:
        """Requests not closed, in id order (a closed one leaves the index here: closing is
        final)."""
        closed = [r for r in self._open if self._records[r].status in CLOSED]
        self._open.difference_update(closed)
        return sorted(self._open)

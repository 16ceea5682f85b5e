"""Completion policies: who decides when the emulated device's commands complete, and in
which order. A policy sees the device's queues through `Queues` (their ready heads, completing
one), never the whole device; the device's executor (the host's process, or a device process:
`process.py`) applies what completes.

- `ManualScheduler`: only the caller (`device.step(cq)`) and host-blocking calls advance it.
- `SeededScheduler`: after every host call, a seeded RNG completes a random number of ready
  commands, picking the queue at random; the same seed and calls give the same completion order.
- `TimedScheduler`: per-command device times on a simulated clock, so which queue finishes first
  follows the times (jittered by a seed), and a seed replays it, late reads included: a stalled
  read is held until the host gave up waiting for it.

A host-blocking call completes exactly what it must: the commands ahead of the awaited one on its
queue and, through events, the other queue's commands they wait for. (`ThreadedScheduler`,
`threads.py`, and `ProcessScheduler`, `process.py`, run commands as soon as they are ready
instead: the device's own concurrency, not a policy.)
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Mapping
from typing import Protocol

from .commands import Command


class Queues(Protocol):
    """What a completion policy sees of a device: its queues' ready heads, and completing them
    (each call made with the device lock held)."""

    @property
    def closed(self) -> bool: ...

    def ready_commands(self) -> list[Command]:
        """The head command of each queue that can complete now."""

    def step(self, cq_id: int) -> Command:
        """Complete the next command of queue `cq_id`."""

    def complete_through(self, command: Command) -> None:
        """Complete `command` and exactly what must complete before it."""

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for a completion (the device lock released meanwhile)."""


def stall_by_wall_clock(command: Command, seconds: float) -> None:
    """The stalled command becomes ready `seconds` from now, by the wall clock."""
    command.not_before = time.monotonic() + seconds


class ManualScheduler:
    """Completes nothing by itself: the caller steps the device, a host-blocking call completes
    what it awaits."""

    def attach(self, device: Queues) -> None:
        pass

    def enqueued(self, device: Queues) -> None:
        pass

    def block_until(self, device: Queues, command: Command) -> None:
        device.complete_through(command)

    def stall(self, device: Queues, command: Command, seconds: float) -> None:
        stall_by_wall_clock(command, seconds)

    def close(self) -> None:
        pass


class SeededScheduler(ManualScheduler):
    """`eagerness` is the chance, repeated, that one more ready command completes after a call."""

    def __init__(self, seed: int, eagerness: float = 0.6) -> None:
        self.seed = seed
        self.eagerness = eagerness
        self._rng = random.Random(seed)

    def enqueued(self, device: Queues) -> None:
        while self._rng.random() < self.eagerness:
            ready = device.ready_commands()
            if not ready:
                return
            device.step(self._rng.choice(ready).cq)


class TimedScheduler(ManualScheduler):
    """Per-command device times on a simulated clock: deterministic, unlike the threads.

    Each host call advances the host clock by `host_s`. A queue's head command starts once it is
    ready and its queue is free, and completes `costs[name]` (default `default_s`) later, times a
    seeded jitter in [1 - jitter, 1 + jitter]; every command whose completion time the host clock
    has passed completes, earliest first. A host-blocking call moves the clock on to the awaited
    command's completion.
    """

    def __init__(self, costs: Mapping[str, float] | None = None, seed: int = 0, *,
                 host_s: float = 1.0, default_s: float = 0.5, jitter: float = 0.5,
                 patience_s: float | None = None) -> None:
        """`patience_s`: how long (wall clock) a wait the host gave up on stays held when the
        host makes no call meanwhile (it waits on another readback queued behind it): then the
        held read lands in the waiter's own thread, while the host is blocked. Set it well
        above the host's deadline; None: until the host's next call."""
        if host_s <= 0 or default_s < 0 or not 0 <= jitter < 1:
            raise ValueError("TimedScheduler: host_s > 0, default_s >= 0 and 0 <= jitter < 1")
        if any(c < 0 for c in (costs or {}).values()):
            raise ValueError("TimedScheduler: command times must be 0 or more")
        self.costs: Mapping[str, float] = costs or {}
        self.host_s, self.default_s, self.jitter = host_s, default_s, jitter
        self._rng = random.Random(seed)
        self.clock = 0.0
        self._free_at: dict[int, float] = {}  # queue -> when its last command completed
        self._due: dict[int, float] = {}  # command id -> when it completes (once started)
        self._held: list[Command] = []  # stalled reads, held until the host gave up on them
        self._given_up: Command | None = None  # what a waiter the host gave up on awaits
        self._host: int | None = None  # the thread that enqueues (the host's)
        self.patience_s = patience_s

    def _next(self, device: Queues) -> tuple[float, Command] | None:
        """The ready head command that completes first, with its completion time."""
        best: tuple[float, Command] | None = None
        for head in device.ready_commands():
            if head.id not in self._due:
                start = max(self.clock, self._free_at.get(head.cq, 0.0))
                cost = self.costs.get(head.name, self.default_s)
                self._due[head.id] = start + cost * self._rng.uniform(1 - self.jitter,
                                                                      1 + self.jitter)
            due = self._due[head.id]
            if best is None or (due, head.cq) < (best[0], best[1].cq):
                best = (due, head)
        return best

    def _complete(self, device: Queues, due: float, head: Command) -> None:
        device.step(head.cq)
        self._free_at[head.cq] = due
        del self._due[head.id]

    def stall(self, device: Queues, command: Command, seconds: float) -> None:
        """A late read on the simulated clock: held (never ready) until the host gave up waiting
        for it, then it lands in the host's next call. `seconds` is a wall-clock delay and the
        host's deadline is wall-clock too: here "late" means "after the host gave up", which a
        seed replays; a wall-clock delay would make the run depend on the machine's speed."""
        command.not_before = math.inf
        self._held.append(command)

    def _release(self, device: Queues) -> None:
        """The held reads land now, and so does what a waiter the host gave up on awaits: in the
        host's call, so every completion happens at a point of the host's calls (deterministic),
        none in the waiter's thread while the host runs."""
        for command in self._held:
            command.not_before = None
        self._held.clear()
        given_up, self._given_up = self._given_up, None
        if given_up is not None:
            self._run_until(device, given_up)

    def _run_until(self, device: Queues, command: Command) -> bool:
        """Run the clock on until `command` completed; False where a held read is in the way."""
        while not command.done:
            nxt = self._next(device)
            if nxt is None:
                if self._held:
                    return False
                device.complete_through(command)  # nothing can run: let the device say why
                return True
            self.clock = max(self.clock, nxt[0])
            self._complete(device, *nxt)
        return True

    def enqueued(self, device: Queues) -> None:
        self._host = threading.get_ident()  # only the host enqueues
        if self._given_up is not None:
            self._release(device)
        self.clock += self.host_s
        while (nxt := self._next(device)) is not None and nxt[0] <= self.clock:
            self._complete(device, *nxt)

    def block_until(self, device: Queues, command: Command) -> None:
        host = threading.get_ident() in (self._host, None)
        if host and self._given_up is not None:
            self._release(device)
        while not self._run_until(device, command):
            if host:  # the host waits without a deadline: the late reads land now
                self._release(device)
                continue
            # A wait beside the host (a readback with a deadline, in a helper thread) that
            # cannot finish before a held read: the host gives up on it, and its next call
            # lands the read and completes what this wait awaits (`_release`).
            self._given_up = command
            patience = math.inf if self.patience_s is None else self.patience_s
            until = time.monotonic() + patience
            while not command.done and not device.closed:
                left = until - time.monotonic()
                if left <= 0:  # the host made no call: it waits on a wait queued behind this
                    self._release(device)
                    break
                device.wait(min(left, 0.5))
            if not command.done:
                raise RuntimeError(f"the device closed before {command.label} completed")

"""Who advances the emulated device.

- `ManualScheduler`: only the caller (`device.step(cq)`) and host-blocking calls advance it.
- `SeededScheduler`: after every host call, a seeded RNG completes a random number of ready
  commands, picking the queue at random; the same seed and calls give the same completion order.
- `ThreadedScheduler`: one real worker thread per CQ runs commands as soon as they are ready.
- `TimedScheduler`: the threaded scheduler's per-command device times on a simulated clock, so
  which queue finishes first follows the times (jittered by a seed), and a seed replays it,
  late reads included: a stalled read is held until the host gave up waiting for it.

In all but the threaded one, a host-blocking call completes exactly what it must: the commands
ahead of the awaited one on its queue and, through events, the other queue's commands they wait
for.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .commands import Command

if TYPE_CHECKING:
    from .device import EmulatedMeshDevice


class Scheduler(Protocol):
    def attach(self, device: EmulatedMeshDevice) -> None: ...

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        """Called (with the device lock held) after a host call enqueued commands."""

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        """Return once `command` completed (called with the device lock held)."""

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        """An injected late read: `command` completes late (called with the device lock held)."""

    def close(self) -> None: ...


class Executor(Protocol):
    def run(self, device: EmulatedMeshDevice, head: Command) -> None:
        """Do what `head` (its queue's ready head, still queued) says, elsewhere (a device
        process): `device.step` then marks it done."""


def stall_by_wall_clock(command: Command, seconds: float) -> None:
    """The stalled command becomes ready `seconds` from now, by the wall clock."""
    command.not_before = time.monotonic() + seconds


class ManualScheduler:
    def attach(self, device: EmulatedMeshDevice) -> None:
        pass

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        pass

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        device.complete_through(command)

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        stall_by_wall_clock(command, seconds)

    def close(self) -> None:
        pass


class SeededScheduler(ManualScheduler):
    """`eagerness` is the chance, repeated, that one more ready command completes after a call."""

    def __init__(self, seed: int, eagerness: float = 0.6) -> None:
        self.seed = seed
        self.eagerness = eagerness
        self._rng = random.Random(seed)

    def enqueued(self, device: EmulatedMeshDevice) -> None:
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

    def _next(self, device: EmulatedMeshDevice) -> tuple[float, Command] | None:
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

    def _complete(self, device: EmulatedMeshDevice, due: float, head: Command) -> None:
        device.step(head.cq)
        self._free_at[head.cq] = due
        del self._due[head.id]

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        """A late read on the simulated clock: held (never ready) until the host gave up waiting
        for it, then it lands in the host's next call. `seconds` is a wall-clock delay and the
        host's deadline is wall-clock too: here "late" means "after the host gave up", which a
        seed replays; a wall-clock delay would make the run depend on the machine's speed."""
        command.not_before = math.inf
        self._held.append(command)

    def _release(self, device: EmulatedMeshDevice) -> None:
        """The held reads land now, and so does what a waiter the host gave up on awaits: in the
        host's call, so every completion happens at a point of the host's calls (deterministic),
        none in the waiter's thread while the host runs."""
        for command in self._held:
            command.not_before = None
        self._held.clear()
        given_up, self._given_up = self._given_up, None
        if given_up is not None:
            self._run_until(device, given_up)

    def _run_until(self, device: EmulatedMeshDevice, command: Command) -> bool:
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

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        self._host = threading.get_ident()  # only the host enqueues
        if self._given_up is not None:
            self._release(device)
        self.clock += self.host_s
        while (nxt := self._next(device)) is not None and nxt[0] <= self.clock:
            self._complete(device, *nxt)

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
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
                device.condition.wait(timeout=min(left, 0.5))
            if not command.done:
                raise RuntimeError(f"the device closed before {command.label} completed")


class ThreadedScheduler:
    """Real concurrency for soak runs: completion order depends on the OS scheduler.

    `costs` gives named commands a device time: the command occupies its queue that long
    before it completes, and the wait releases the device lock (a chip runs on its own), so
    the host keeps enqueueing meanwhile.
    """

    def __init__(self, costs: Mapping[str, float] | None = None) -> None:
        self.costs: Mapping[str, float] = costs or {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._device: EmulatedMeshDevice | None = None
        self._wake: list[threading.Condition] = []
        self._awaited: dict[Command, threading.Condition] = {}  # what the host blocks on
        self.failure: BaseException | None = None
        self.cpu_s: dict[int, float] = {}
        """Each queue worker's own CPU seconds (`time.thread_time`), set when it stops: the
        emulated device's Python work, which on a chip is device time."""
        self.busy_s: dict[int, float] = {}
        """Seconds each queue was busy: from taking up a ready command (its configured time
        included) to its completion. A queue runs one command at a time, so this is the device
        time of its commands."""

    def attach(self, device: EmulatedMeshDevice) -> None:
        self._device = device
        # One wake-up per worker, on the device lock: a worker is woken when its queue's head
        # can run, not at every host call and completion (each wake-up takes the GIL from the
        # host, which a chip's queues never do).
        self._wake = [threading.Condition(device.condition)  # type: ignore[arg-type]
                      for _ in device.queues]  # (a Condition serves as its own lock here)
        device.observers.append(self._completed)
        for cq in range(device.num_command_queues):
            thread = threading.Thread(
                target=self._work, args=(cq,), name=f"emulated-CQ{cq}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _wake_ready(self, device: EmulatedMeshDevice) -> None:
        """Wake each worker whose queue's head can run now, or waits for a time (a stall)."""
        for queue, wake in zip(device.queues, self._wake, strict=True):
            if queue and (queue[0].not_before is not None or queue[0].ready()):
                wake.notify()

    def _completed(self, command: Command) -> None:
        """A command completed (by a worker or the host): its event may free another head, and
        the host may be waiting for it (only then is the host woken: a wake-up per command
        would take the GIL from the workers)."""
        assert self._device is not None
        self._wake_ready(self._device)
        host = self._awaited.pop(command, None)
        if host is not None:
            host.notify_all()

    def _work(self, cq: int) -> None:
        try:
            self._serve(cq)
        except BaseException as error:  # the host waits on this worker: never die silently
            self.failure = self.failure or error
            raise
        finally:
            self.cpu_s[cq] = time.thread_time()

    def _serve(self, cq: int) -> None:
        device = self._device
        assert device is not None
        queue, wake = device.queues[cq], self._wake[cq]
        with device.condition:
            while not self._stopping.is_set():
                if not (queue and queue[0].ready()):
                    stalled = queue[0].not_before if queue else None  # an injected late completion
                    wait = 0.5 if stalled is None else min(0.5, stalled - time.monotonic() + 1e-3)
                    wake.wait(timeout=max(wait, 1e-3))
                    continue
                head = queue[0]
                began = time.perf_counter()
                cost = self.costs.get(head.name, 0.0)
                if cost > 0:
                    # The queue is busy that long (only this worker pops it): asleep without the
                    # device lock, and not woken by every host call, each wake-up taking the GIL
                    # from the host for nothing (a chip shares no GIL with it).
                    device.condition.release()
                    try:
                        self._stopping.wait(cost)
                    finally:
                        device.condition.acquire()
                    if not (queue and queue[0] is head):
                        continue  # the host completed it meanwhile (a drain, a blocking read)
                try:
                    device.step(cq)
                except BaseException as error:
                    self.failure = error
                    for host in self._awaited.values():
                        host.notify_all()
                    device.condition.notify_all()
                    return
                self.busy_s[cq] = self.busy_s.get(cq, 0.0) + time.perf_counter() - began

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        self._wake_ready(device)

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        stall_by_wall_clock(command, seconds)

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        while not command.done:
            if self.failure is not None:
                raise RuntimeError("an emulated command queue worker failed") from self.failure
            done = self._awaited.get(command)
            if done is None:
                done = self._awaited[command] = threading.Condition(device.condition)  # type: ignore[arg-type]
            done.wait(timeout=0.5)

    def close(self) -> None:
        device = self._device
        self._stopping.set()
        if device is not None:
            with device.condition:
                if self._completed in device.observers:
                    device.observers.remove(self._completed)
                for wake in self._wake:
                    wake.notify_all()
                device.condition.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)

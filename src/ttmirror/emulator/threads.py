"""Real concurrency for soak runs: one worker thread per command queue, in the host's process.

Emulated only: on a chip the device's queues are the chip's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .commands import Command
from .schedulers import stall_by_wall_clock

if TYPE_CHECKING:
    from .device import EmulatedMeshDevice


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

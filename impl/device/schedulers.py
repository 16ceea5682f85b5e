"""Who advances the emulated device.

- `ManualScheduler`: only the caller (`device.step(cq)`) and host-blocking calls advance it.
- `SeededScheduler`: after every host call, a seeded RNG completes a random number of ready
  commands, picking the queue at random; the same seed and calls give the same completion order.
- `ThreadedScheduler`: one real worker thread per CQ runs commands as soon as they are ready.

In the first two, a host-blocking call completes exactly what it must: the commands ahead of the
awaited one on its queue and, through events, the other queue's commands they wait for.
"""

from __future__ import annotations

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

    def close(self) -> None: ...


class ManualScheduler:
    def attach(self, device: EmulatedMeshDevice) -> None:
        pass

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        pass

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        device.complete_through(command)

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


class ThreadedScheduler:
    """Real concurrency for soak runs: completion order depends on the OS scheduler.

    `costs` gives named commands a device time: the command occupies its queue that long
    before it completes, and the wait releases the device lock (a chip runs on its own), so
    the host keeps enqueueing meanwhile.
    """

    def __init__(self, costs: Mapping[str, float] | None = None) -> None:
        self.costs: Mapping[str, float] = costs or {}
        self._threads: list[threading.Thread] = []
        self._stop = False
        self._device: EmulatedMeshDevice | None = None
        self.failure: BaseException | None = None

    def attach(self, device: EmulatedMeshDevice) -> None:
        self._device = device
        for cq in range(device.num_command_queues):
            thread = threading.Thread(
                target=self._work, args=(cq,), name=f"emulated-CQ{cq}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _work(self, cq: int) -> None:
        device = self._device
        assert device is not None
        queue = device.queues[cq]
        with device.condition:
            while not self._stop:
                if not (queue and queue[0].ready()):
                    device.condition.wait(timeout=0.5)
                    continue
                deadline = time.perf_counter() + self.costs.get(queue[0].name, 0.0)
                while (left := deadline - time.perf_counter()) > 0 and not self._stop:
                    device.condition.wait(timeout=left)  # only this worker pops this queue
                try:
                    device.step(cq)
                except BaseException as error:
                    self.failure = error
                    device.condition.notify_all()
                    return

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        device.condition.notify_all()

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        while not command.done:
            if self.failure is not None:
                raise RuntimeError("an emulated command queue worker failed") from self.failure
            device.condition.wait(timeout=0.5)

    def close(self) -> None:
        device = self._device
        self._stop = True
        if device is not None:
            with device.condition:
                device.condition.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)

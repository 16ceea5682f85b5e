"""Device data as it comes into being: the combine's output and each slot's content.

The model's `combine` gives each row the id it `consumed`; its `launch` writes the slot's
`content`. On the emulated device those are bytes that a command writes when it completes,
and the harness sees them then, through a test-only view of the emulated memory: each completed
command is reported to the observer (`EmulatedMeshDevice.observers`) with the buffers it wrote,
and the observer copies what matters before anything can overwrite it. Nothing is enqueued and no
ordering changes, so observing cannot hide or cause a hazard. `impl/` never uses this view.

Which command stands for which model effect (attributed when the host issues it):

=================================  ==========================================================
model effect                       the command whose completion makes it exist
=================================  ==========================================================
combine(q): rows[i].consumed       the one writing the combine's input ids (`where`), issued by
                                   step q's combine (eager) or by its launch's trace replay
launch(q): slots[k].content        the one writing ring slot k (the sampler), issued by step
                                   q's launch (eager, or inside the trace replay)
readback_complete(q): host_copy    none: the host copy is the host's, read after the event
=================================  ==========================================================

On the cpu backend the mirror computes on the host, synchronously: the effects exist when the
combine and launch return, and are copied then. On a chip no such view exists; the observer is
absent and the abstraction erases `consumed` and `content`, as before (`Lockstep` says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..impl.runner import Runner


@dataclass
class Observed:
    """What the device computed, keyed the way the model names it."""

    consumed: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Step number -> the combine's output ids, once its command completed."""
    content: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """Slot -> (the step whose sampler wrote it, the ids), once that command completed."""
    problems: list[str] = field(default_factory=list)
    """Device effects in an order the model forbids (a sampler before its own combine)."""


class DeviceObserver:
    """Watches one emulated device running one runner's tt mirror."""

    available = True

    def __init__(self, runner: Runner) -> None:
        mirror: Any = runner.mirror
        self.runner = runner
        self.device = mirror.device
        self.input_ids = mirror.combiner.input_ids.buffer
        self.slots = {slot.buffer: k for k, slot in enumerate(mirror.ring.slots)}
        self.views = {"input_ids": mirror.combiner.input_ids, **{
            f"slot{k}": slot for k, slot in enumerate(mirror.ring.slots)}}
        self.effects: dict[int, tuple[str, int]] = {}
        """Command id -> ("combine" | "launch", step number)."""
        self.seen = 0
        self.seen = self._newest()
        self.observed = Observed()
        self.device.observers.append(self._completed)

    def issued(self, step: int) -> None:
        """Attribute the commands the host just enqueued for `step` (after its combine or
        launch): which one writes the input ids, which one writes a slot."""
        for queue in self.device.queues:
            for command in queue:
                if command.id <= self.seen:
                    continue
                for buffer in command.writes:
                    if buffer is self.input_ids:
                        self.effects[command.id] = ("combine", step)
                    elif buffer in self.slots:
                        self.effects[command.id] = ("launch", step)
        self.seen = self._newest()

    def next_effect(self, cq: int) -> Any | None:
        """The next command on `cq` that makes a model effect exist, if it can be reached by
        completing `cq`'s commands in order now (each ready, or waiting on one before it)."""
        if cq >= len(self.device.queues):
            return None  # a one-queue device
        earlier: set[int] = set()
        for command in self.device.queues[cq]:
            if not command.ready() and (
                command.event is None or command.event.record.id not in earlier
            ):
                return None
            if command.id in self.effects:
                return command
            earlier.add(command.id)
        return None

    def _completed(self, command: Any) -> None:
        effect = self.effects.pop(command.id, None)
        if effect is None:
            return
        kind, step = effect
        if kind == "combine":
            self.observed.consumed[step] = _ids(self.views["input_ids"])
            return
        if step not in self.observed.consumed:
            self.observed.problems.append(
                f"the sampler of step {step} completed before its combine wrote the input ids"
            )
        slot = next(self.slots[b] for b in command.writes if b in self.slots)
        self.observed.content[slot] = (step, _ids(self.views[f"slot{slot}"]))

    def _newest(self) -> int:
        """The newest command id enqueued so far (ids only grow)."""
        return max((c.id for q in self.device.queues for c in q), default=self.seen)

    def close(self) -> None:
        if self._completed in self.device.observers:
            self.device.observers.remove(self._completed)


class HostObserver:
    """The cpu mirror: its effects exist when the combine and the launch return."""

    available = True

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.observed = Observed()

    def combined(self, step: int) -> None:
        mirror: Any = self.runner.mirror
        self.observed.consumed[step] = tuple(int(v) for v in mirror.input_ids.tolist())

    def launched(self, step: int, slot: int) -> None:
        mirror: Any = self.runner.mirror
        self.observed.content[slot] = (step, tuple(int(v) for v in mirror.ring[slot].tolist()))

    def close(self) -> None:
        pass


def _ids(tensor: Any) -> tuple[int, ...]:
    """The ids a device tensor holds, read through the emulated memory (no command)."""
    return tuple(int(v) & 0xFFFFFFFF for v in tensor.data.reshape(-1).tolist())

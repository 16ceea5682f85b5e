"""What a command queue holds: commands as data, the events that order queues, and trace ids.

A command's effect is data, never a closure: a host write (the values, taken at enqueue, and
where they go), a host read (which DRAM elements, into which host tensor) or a kernel (a
registered kernel's name, its operands as DRAM regions or plain values, its outputs, its
parameters). Completing a command reads and writes DRAM at those addresses then. Held as data,
a queue can be printed, compared and copied with the device it belongs to (`snapshot.py`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import ttnn

from .allocator import Buffer
from .ordering import Clock
from .tensors import Operand


@dataclass(frozen=True, eq=False)
class HostWrite:
    """A host-to-device copy: `values` (copied from the host at enqueue) into `destination`."""

    destination: Operand
    values: torch.Tensor

    def __repr__(self) -> str:
        return f"HostWrite({self.values.tolist()} -> {self.destination})"


@dataclass(frozen=True, eq=False)
class HostRead:
    """A device-to-host copy: `source`'s elements into the storage of a host tensor.

    `host` holds a weak-referenceable host tensor (a non-blocking readback's) weakly: the host
    dropping it before the copy lands must stay observable (a hazard); a plain one strongly."""

    source: Operand
    host: ttnn.Tensor | weakref.ref[ttnn.Tensor]

    def target(self) -> ttnn.Tensor | None:
        """The host tensor the copy lands in; None once the host dropped it."""
        host = self.host
        return host() if isinstance(host, weakref.ref) else host

    def __repr__(self) -> str:
        held = "a host tensor" if self.target() is not None else "a dropped host tensor"
        return f"HostRead({self.source} -> {held})"


KernelFn = Callable[[list[Any], list[torch.Tensor], Mapping[str, Any]], None]
"""A kernel's effect: (its arguments, DRAM operands as views; its output views; its parameters)."""
KERNELS: dict[str, KernelFn] = {}
"""Every kernel the emulated device can run, by name (registered by the modules defining ops)."""


def register_kernel(name: str, fn: KernelFn) -> None:
    """Make `name` runnable by a `Kernel` command (code, registered once at import: not state)."""
    KERNELS[name] = fn


@dataclass(frozen=True, eq=False)
class Kernel:
    """A device op's effect as data: the registered kernel `name` run on `args` (an `Operand`
    is read from DRAM when the command completes; any other value is passed as it is), writing
    `outputs`, with `params`."""

    name: str
    args: tuple[Any, ...]
    outputs: tuple[Operand, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in KERNELS:
            raise KeyError(f"no kernel named {self.name!r} is registered")

    def __repr__(self) -> str:
        params = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{self.name}({', '.join(map(repr, self.args))}{params}) -> {self.outputs}"


type Effect = HostWrite | HostRead | Kernel


@dataclass(frozen=True)
class WriteBytes:
    """A host write as it crosses to a device process: its values' bytes, dtype and shape."""

    destination: Operand
    raw: bytes
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def values(self) -> torch.Tensor:
        raw = torch.frombuffer(bytearray(self.raw), dtype=torch.uint8) if self.raw else (
            torch.empty(0, dtype=torch.uint8))
        return raw.view(self.dtype).view(self.shape)


@dataclass(frozen=True)
class ReadToStaging:
    """A host read as it crosses to a device process: `source`'s bytes go into the staging area
    at `offset`, from where the host lands them in its tensor."""

    source: Operand
    offset: int


def apply(effect: Effect | WriteBytes | ReadToStaging, view: Callable[[Operand], torch.Tensor],
          read_into: Callable[[Any], torch.Tensor | None],
          resolve: Callable[[Any], Any] = lambda value: value) -> None:
    """Do what a command says, on DRAM as it is now (`view`: an operand's elements): run a
    kernel (its other arguments and its parameters through `resolve`), copy a write's values
    in, copy a read's elements into `read_into(effect)` (None: the host dropped its tensor, and
    the copy lands nowhere). The one place an effect is applied: by the host's process and by a
    device process alike."""
    if isinstance(effect, Kernel):
        KERNELS[effect.name](
            [view(a) if type(a) is Operand else resolve(a) for a in effect.args],
            [view(o) for o in effect.outputs],
            {k: resolve(v) for k, v in effect.params.items()})
    elif isinstance(effect, HostWrite | WriteBytes):
        view(effect.destination).copy_(effect.values)
    else:
        into = read_into(effect)
        if into is not None:
            into.copy_(view(effect.source))


@dataclass(eq=False)
class Command:
    """One entry of a CQ. It completes only when the device is advanced past it."""

    id: int
    name: str
    cq: int
    index: int  # 1-based position on its CQ
    clock: Clock
    effect: Effect | None = None
    """What completing it does to DRAM or a host tensor; None for events and barriers."""
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
    kernel: Kernel
    cache_key: object = None
    trace: int | None = field(default=None)

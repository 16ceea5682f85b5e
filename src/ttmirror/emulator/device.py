"""The emulated mesh device: command queues, events, traces and DRAM, reporting every hazard.

One object owns all device state. Host calls enqueue commands; commands complete only when the
device is advanced (by the caller's `step`, by a scheduler, or by a host-blocking call, which
completes exactly what it must). Reads and writes of device memory happen when a command
completes, at the addresses it was given, so timing bugs produce real wrong data.
"""

from __future__ import annotations

import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
import ttnn

from .allocator import Buffer, DramAllocator
from .commands import (
    Command,
    Effect,
    HostRead,
    HostWrite,
    MeshEvent,
    MeshTraceId,
    Operand,
    Program,
    apply,
)
from .hazards import Hazard, HazardKind, HazardLog, HazardMode
from .injection import FaultInjector
from .ordering import OrderingTracker
from .process import ProcessScheduler
from .readbacks import PendingReadback, PendingReadbacks
from .schedulers import ManualScheduler
from .signatures import introspect_method
from .tensors import (
    DeviceTensor,
    HostReadback,
    host_bytes,
    host_operand,
    kept_view,
    new_host_tensor,
    storage_bytes,
)
from .traces import Trace

if TYPE_CHECKING:
    from .checker import Satisfied

DEFAULT_DRAM_SIZE = 64 << 20
# Nominal trace-buffer bytes per captured command: real sizes depend on the program, but a
# device opened without a trace region must fail to capture, as on the chip.
TRACE_BYTES_PER_COMMAND = 4096
GARBAGE_BYTE = 0xCD  # what a non-blocking readback's host tensor holds until the read completes

READS_IN_CAPTURE = "Reads are not supported during trace capture"
WRITES_IN_CAPTURE = "Writes are not supported during trace capture"
EVENTS_IN_CAPTURE = "Event Synchronization is not supported during trace capture"


class Scheduler(Protocol):
    """Who completes the device's commands, as the device calls it (with its lock held): a
    completion policy (`schedulers.py`), or the device's own concurrency (`threads.py`,
    `process.py`)."""

    def attach(self, device: EmulatedMeshDevice) -> None: ...

    def enqueued(self, device: EmulatedMeshDevice) -> None:
        """After a host call enqueued commands."""

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        """Return once `command` completed."""

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        """An injected late read: `command` completes late."""

    def close(self) -> None: ...


class Executor(Protocol):
    """Where a device's commands run: it owns the lock over the device's state, and applies
    each command the device completes (`InHost` here; a device process, `process.py`)."""

    lock: threading.Condition
    """The device's lock: every host call, completion and wait holds it or waits on it."""

    def apply(self, device: EmulatedMeshDevice, head: Command) -> None:
        """Do what `head` (its queue's ready head, still queued) says; `device.step` then takes
        it off its queue and marks it done."""


class InHost:
    """The executor of a device whose commands run in the host's process: its lock, and each
    command's effect applied on DRAM here (`commands.apply`)."""

    def __init__(self) -> None:
        self.lock = threading.Condition(threading.RLock())

    def apply(self, device: EmulatedMeshDevice, head: Command) -> None:
        if head.effect is not None:
            apply(head.effect, device.view, _host_target)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a lock is not state: a copy has its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.lock = threading.Condition(threading.RLock())


OPEN: weakref.WeakSet[EmulatedMeshDevice] = weakref.WeakSet()
"""The emulated devices open now, copies included: a diagnostic only (the test suite fails a test
that leaves one open, with its device process); nothing decides anything by it."""

_TENSOR_CPU = introspect_method(ttnn.Tensor, "cpu")
_TENSOR_DEALLOCATE = introspect_method(ttnn.Tensor, "deallocate")


def _cq(value: Any) -> int:
    return 0 if value is None else int(value)


class EmulatedMeshDevice:
    """A 1x1 mesh with up to two command queues, a DRAM region and a trace region."""

    def __init__(
        self,
        *,
        num_command_queues: int = 2,
        trace_region_size: int = 0,
        l1_small_size: int = 0,
        dram_size: int = DEFAULT_DRAM_SIZE,
        scheduler: Scheduler | None = None,
        hazard_mode: HazardMode = "raise",
        planted: frozenset[str] = frozenset(),
    ) -> None:
        """`planted`: bugs of the allocator (`allocator.PLANTED`), to show its checks live."""
        if not 1 <= num_command_queues <= 2:
            raise RuntimeError(f"num_command_queues must be 1 or 2, got {num_command_queues}")
        self.num_command_queues = num_command_queues
        self.trace_region_size = trace_region_size
        self.l1_small_size = l1_small_size
        self.hazards = HazardLog(mode=hazard_mode)
        self.allocator = DramAllocator(dram_size, hazards=self.hazards, planted=planted)
        self.ordering = OrderingTracker(num_command_queues)
        self.queues: list[deque[Command]] = [deque() for _ in range(num_command_queues)]
        self.completion_log: list[str] = []  # command labels in completion order
        self.program_cache: set[object] = set()
        self.executor: Executor = InHost()
        """Where the commands run, and the lock over this device's state (`condition`)."""
        self.closed = False
        self.on_close: list[Callable[[EmulatedMeshDevice], None]] = []
        """Called once the device has closed."""
        self.readbacks = PendingReadbacks(self)
        """Non-blocking readbacks the host has not synchronised with (`readbacks.py`)."""
        self.api: Any = None
        """The ttnn API this device's calls go through (`api.EmulatedTtnn`), set by the
        provider that opens it (`entry.py`); it travels with a copy."""
        self.observers: list[Callable[[Command], None]] = []
        """Called with each command as it completes, its writes done: how a conformance harness
        sees device data the moment it exists, without a command of its own (emulated only)."""
        self.sampling_identity: tuple[DeviceTensor, DeviceTensor] | None = None
        self.checked_calls: list[Satisfied] | None = None
        """While `checker.recording(self)` runs: each op call that passed the support check,
        with the documented rows it met."""
        self._last_id = 0  # plain ints, not itertools counters: the state must copy as data
        self._last_trace_id = -1
        self._traces: dict[int, Trace] = {}
        self._capturing: dict[int, Trace] = {}
        self._views: dict[Operand, torch.Tensor] = {}  # views of DRAM, not state: never copied
        self.faults = FaultInjector()
        """Faults armed at run time (`injection.py`): calls that raise, reads that stall."""
        OPEN.add(self)
        self.scheduler: Scheduler = scheduler or ManualScheduler()
        self.scheduler.attach(self)

    # --- what a ttnn.MeshDevice answers ----------------------------------------------------------
    @property
    def shape(self) -> ttnn.MeshShape:
        return ttnn.MeshShape(1, 1)

    def get_num_devices(self) -> int:
        return 1

    def num_program_cache_entries(self) -> int:
        return len(self.program_cache)

    def __repr__(self) -> str:
        return (
            f"EmulatedMeshDevice(1x1, {self.num_command_queues} CQs, {self.allocator.size} B DRAM)"
        )

    # --- advancing the device (the caller's and the schedulers' API) -----------------------------
    def step(self, cq_id: int) -> Command:
        """Complete the next command on `cq_id`; raises if the queue is empty or its head waits."""
        with self.condition:
            queue = self.queues[cq_id]
            if not queue:
                raise IndexError(f"CQ{cq_id} has no command to complete")
            head = queue[0]
            if not head.ready():
                raise RuntimeError(f"CQ{cq_id}: {head.label} waits for {head.event} to complete")
            self.executor.apply(self, head)
            queue.popleft()
            return self._done(head)

    def retire(self, cq_id: int) -> Command:
        """The next command on `cq_id` completed elsewhere (a device process ran its effect):
        mark it done and tell the observers, as `step` does after running it."""
        with self.condition:
            return self._done(self.queues[cq_id].popleft())

    def _done(self, head: Command) -> Command:
        """`head` completed, its effect done: mark it, log it, tell the observers."""
        head.effect = None  # done: a host tensor it wrote is the host's alone now
        head.done = True
        self.completion_log.append(head.label)
        for observer in self.observers:
            observer(head)
        self.condition.notify_all()
        return head

    @property
    def condition(self) -> threading.Condition:
        """The lock over this device's state: its executor's."""
        return self.executor.lock

    def view(self, operand: Operand) -> torch.Tensor:
        """`operand`'s elements in DRAM, a view kept per operand (`kept_view`)."""
        return kept_view(self._views, self.allocator.memory, operand)

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for a completion, the device lock released meanwhile
        (called with it held)."""
        self.condition.wait(timeout=timeout)

    def ready_commands(self) -> list[Command]:
        """The head command of each queue that can complete now."""
        with self.condition:
            return [q[0] for q in self.queues if q and q[0].ready()]

    def pending(self, cq_id: int | None = None) -> int:
        with self.condition:
            queues = self.queues if cq_id is None else [self.queues[cq_id]]
            return sum(len(q) for q in queues)

    def drain(self) -> None:
        """Complete every enqueued command (a device-side advance: the host learns nothing)."""
        with self.condition:
            for queue in self.queues:
                if queue:
                    self.scheduler.block_until(self, queue[-1])

    def complete_through(self, command: Command) -> None:
        """Complete `command` and exactly what must complete before it."""
        with self.condition:
            queue = self.queues[command.cq]
            while not command.done:
                head = queue[0]
                if head.not_before is not None and not head.ready():
                    self._wait_stalled(head)
                    continue
                if not head.ready():
                    assert head.event is not None
                    self.complete_through(head.event.record)
                self.step(command.cq)

    def _wait_stalled(self, head: Command) -> None:
        """A stalled command (an injected late completion) becomes ready by the wall clock."""
        assert head.not_before is not None
        self.condition.wait(timeout=max(head.not_before - time.monotonic(), 0.0) + 1e-3)

    # --- enqueueing ------------------------------------------------------------------------------
    def _enqueue(
        self,
        cq: int,
        name: str,
        *,
        reads: Iterable[Buffer] = (),
        writes: Iterable[Buffer] = (),
        effect: Effect | None = None,
        event: MeshEvent | None = None,
        waits: bool = False,
        trace: int | None = None,
    ) -> tuple[Command, list[Hazard]]:
        if not 0 <= cq < self.num_command_queues:
            raise RuntimeError(
                f"cq_id {cq} out of range: the device was opened with {self.num_command_queues} CQs"
            )
        index, clock = self.ordering.stamp(cq)
        writes = tuple(writes)
        command = Command(
            self._next_id(), name, cq, index, clock, effect, event, waits, trace, writes
        )
        hazards: list[Hazard] = []
        for buffers, write in ((reads, False), (writes, True)):
            for buffer in buffers:
                if not buffer.allocated and trace is None:
                    verb = "writes" if write else "reads"
                    hazards.append(
                        Hazard(
                            HazardKind.USE_AFTER_FREE,
                            f"{command.label} on CQ{cq} {verb} {buffer.label} "
                            "after it was deallocated",
                            buffers=(buffer.label,),
                            commands=(command.label,),
                            queues=(cq,),
                        )
                    )
                hazards += self.ordering.access(buffer, command, cq, index, clock, write=write)
        self.queues[cq].append(command)
        return command, hazards

    def _next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def _fault_point(self, call: str, name: str) -> float | None:
        """Raise the fault armed for this call, if any; a stalled read's delay in seconds."""
        return self.faults.check(call, name) if self.faults.active else None

    def _report(self, hazards: Sequence[Hazard]) -> None:
        for hazard in hazards:
            self.hazards.report(hazard)

    def _capture_on(self, cq: int) -> Trace | None:
        return self._capturing.get(cq)

    def _host_saw(self, command: Command) -> None:
        clock = list(command.clock)
        clock[command.cq] = command.index
        self.ordering.host_knows(tuple(clock))
        self.readbacks.forget_synchronised()

    # --- memory ----------------------------------------------------------------------------------
    def allocate(
        self,
        shape: tuple[int, ...],
        dtype: ttnn.DataType,
        layout: ttnn.Layout,
        memory_config: ttnn.MemoryConfig | None = None,
    ) -> DeviceTensor:
        with self.condition:
            self._fault_point("allocate", "allocate_tensor_on_device")
            buffer = self.allocator.allocate(storage_bytes(shape, dtype, layout))
            self.ordering.adopt(buffer)
            return DeviceTensor(self, buffer, shape, dtype, layout, memory_config)

    def deallocate(self, tensor: DeviceTensor, *, force: bool) -> None:
        """`force` frees even while other handles share the buffer (ttnn.deallocate's default)."""
        with self.condition:
            last = tensor.release_handle()
            if (force or last) and tensor.buffer.allocated:
                self._free(tensor.buffer)

    def free_on_last_reference(self, buffer: Buffer) -> None:
        with self.condition:
            if buffer.allocated and not self.closed:
                self._free(buffer, can_raise=False)  # a destructor cannot raise: defer

    def _free(self, buffer: Buffer, *, can_raise: bool = True) -> None:
        alive = [t for t in buffer.traces if not self._traces[t].released]
        label = buffer.label
        self.ordering.retire(buffer)
        self.allocator.free(buffer)
        for trace_id in alive:
            self.hazards.report(
                Hazard(
                    HazardKind.TRACE_BUFFER_FREED,
                    f"{label} was deallocated while {self._traces[trace_id].label()} "
                    "still uses it: "
                    "replays read and write its address, whatever is allocated there next",
                    buffers=(label,),
                    queues=(self._traces[trace_id].cq,),
                ),
                can_raise=can_raise,
            )

    # --- transfers -------------------------------------------------------------------------------
    def write(self, host: ttnn.Tensor, tensor: DeviceTensor, cq: int) -> None:
        """copy_host_to_device_tensor: the host data is copied into the CQ at enqueue."""
        _check_same_spec(host, tensor, "copy_host_to_device_tensor")
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(WRITES_IN_CAPTURE)
            self._fault_point("write", "copy_host_to_device_tensor")
            self._write_host(tensor, host_operand(host, tensor.operand).clone(), cq,
                             "copy_host_to_device_tensor")

    def upload(
        self,
        host: ttnn.Tensor,
        layout: ttnn.Layout,
        cq: int,
        memory_config: ttnn.MemoryConfig | None = None,
    ) -> DeviceTensor:
        """from_torch(device=) / to_device: allocate, then write the host tensor on `cq`."""
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(WRITES_IN_CAPTURE)
            self._fault_point("write", "to_device")
            shape = tuple(int(d) for d in host.shape)
            tensor = self.allocate(shape, host.dtype, layout, memory_config)
            self._write_host(tensor, host_operand(host, tensor.operand).clone(), cq, "to_device")
            return tensor

    def _write_host(self, tensor: DeviceTensor, source: torch.Tensor, cq: int, name: str) -> None:
        """Enqueue a host-to-device copy of `source` (the logical elements, taken at enqueue)."""
        effect = HostWrite(tensor.operand, source)
        _, hazards = self._enqueue(cq, name, writes=(tensor.buffer,), effect=effect)
        self.scheduler.enqueued(self)
        self._report(hazards)

    def read(
        self,
        tensor: DeviceTensor,
        *,
        cq: int,
        blocking: bool,
        into: ttnn.Tensor | None = None,
        name: str = "read",
    ) -> ttnn.Tensor:
        """A device-to-host copy on `cq`. Non-blocking: the host tensor holds garbage until the
        command completes, and may be read only once the host has synchronised with it."""
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(READS_IN_CAPTURE)
            stall = self._fault_point("read", name)
            shape = tuple(int(d) for d in tensor.shape)
            if into is None:
                into = new_host_tensor(
                    shape, tensor.dtype, ttnn.Tensor if blocking else HostReadback
                )
            else:
                _check_same_spec(into, tensor, "copy_device_to_host_tensor")
            if not blocking:
                host_bytes(into).fill_(GARBAGE_BYTE)
            target: Any = into
            # Weakly held where it can be: the host dropping it early must stay observable.
            held = weakref.ref(into) if isinstance(into, HostReadback) else into
            effect = HostRead(tensor.operand, held)
            command, hazards = self._enqueue(cq, name, reads=(tensor.buffer,), effect=effect)
            if stall is not None:
                self.scheduler.stall(self, command, stall)
            if blocking:
                self.scheduler.enqueued(self)
                self._report(hazards)
                self.scheduler.block_until(self, command)
                self._host_saw(command)
                return into
            on_drop = self._readback_dropped if isinstance(target, HostReadback) else None
            self.readbacks.register(command, target, on_drop=on_drop)
            del target
            self.scheduler.enqueued(self)
            self._report(hazards)
            return into

    def check_host_read(self, record: PendingReadback) -> None:
        command = record.command
        state = (
            "happens to hold the values already, but nothing guaranteed it"
            if command.done
            else "still holds garbage: the read has not completed"
        )
        self.hazards.report(
            Hazard(
                HazardKind.UNSYNCHRONISED_READBACK,
                f"host read of the tensor filled by non-blocking {command.label} on CQ{command.cq} "
                "before the host synchronised with it (event_synchronize on an event recorded "
                f"after it, or synchronize_device); it {state}",
                commands=(command.label,),
                queues=(command.cq,),
            )
        )

    def _readback_dropped(self, record: PendingReadback) -> None:
        if record.synchronised:
            return
        command = record.command
        self.hazards.report(
            Hazard(
                HazardKind.DROPPED_READBACK,
                f"the host tensor of non-blocking {command.label} on CQ{command.cq} "
                "was dropped before "
                "the host synchronised with the read: the copy lands in freed host memory",
                commands=(command.label,),
                queues=(command.cq,),
            ),
            can_raise=False,
        )

    # --- events ----------------------------------------------------------------------------------
    def record_event(self, cq: int) -> MeshEvent:
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(EVENTS_IN_CAPTURE)
            self._fault_point("event", "record_event")
            command, _ = self._enqueue(cq, "record_event")
            clock = list(command.clock)
            clock[cq] = command.index
            event = MeshEvent(cq, command, tuple(clock), self)
            command.event = event
            self.scheduler.enqueued(self)
            return event

    def wait_for_event(self, cq: int, event: MeshEvent) -> None:
        if not isinstance(event, MeshEvent):
            raise TypeError(
                f"wait_for_event: expected a MeshEvent of the emulated device, got {event!r}"
            )
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(EVENTS_IN_CAPTURE)
            self._fault_point("event", "wait_for_event")
            self._enqueue(cq, "wait_for_event", event=event, waits=True)
            self.ordering.wait(cq, event.clock)
            self.scheduler.enqueued(self)

    def event_synchronize(self, event: MeshEvent) -> None:
        with self.condition:
            if self._capturing:
                raise RuntimeError(EVENTS_IN_CAPTURE)
            self._fault_point("sync", "event_synchronize")
            self.scheduler.block_until(self, event.record)
            self.ordering.host_knows(event.clock)
            self.readbacks.forget_synchronised()

    def synchronize(self, cq: int | None = None) -> None:
        with self.condition:
            self._fault_point("sync", "synchronize_device")
            for q in range(self.num_command_queues) if cq is None else [cq]:
                if self.queues[q]:
                    self.scheduler.block_until(self, self.queues[q][-1])
                self.ordering.host_drains(q)
            self.readbacks.forget_synchronised()

    # --- programs --------------------------------------------------------------------------------
    def launch(self, program: Program, cq: int) -> None:
        """Enqueue a device op, or record it when `cq` is capturing a trace."""
        with self.condition:
            self._fault_point("op", program.name)
            trace = self._capture_on(cq)
            if trace is not None:
                if program.cache_key not in self.program_cache:
                    raise RuntimeError(
                        f"{WRITES_IN_CAPTURE}: {program.name} is not in the program cache, and "
                        "compiling it would write its binary (run the op once before capture)"
                    )
                trace.programs.append(program)
                return
            self.program_cache.add(program.cache_key)
            _, hazards = self._enqueue(
                cq, program.name, reads=program.reads, writes=program.writes,
                effect=program.kernel,
            )
            self.scheduler.enqueued(self)
            self._report(hazards)

    def bind_sampling_identity(self, requests: DeviceTensor, positions: DeviceTensor) -> None:
        """Device tensors giving, per sampling row, its request and the position it samples."""
        self.sampling_identity = (requests, positions)

    # --- traces ----------------------------------------------------------------------------------
    def begin_trace_capture(self, cq: int) -> MeshTraceId:
        with self.condition:
            if self._capture_on(cq):
                raise RuntimeError(f"CQ{cq} is already capturing {self._capturing[cq].label()}")
            self._last_trace_id += 1
            trace = Trace(self._last_trace_id, cq, first_serial=self.allocator.next_serial)
            self._traces[trace.id] = trace
            self._capturing[cq] = trace
            return MeshTraceId(trace.id)

    def end_trace_capture(self, trace_id: MeshTraceId, cq: int) -> None:
        with self.condition:
            trace = self._capture_on(cq)
            if trace is None or trace.id != int(trace_id):
                raise RuntimeError(f"trace {int(trace_id)} is not being captured on CQ{cq}")
            del self._capturing[cq]
            size = TRACE_BYTES_PER_COMMAND * len(trace.programs)
            in_use = sum(t.size for t in self._traces.values() if t.captured and not t.released)
            if in_use + size > self.trace_region_size:
                trace.released = True
                raise RuntimeError(
                    f"Creating trace buffers of size {size} B on device 0, but only "
                    f"{self.trace_region_size - in_use} B is allocated for trace region."
                )
            trace.size = size
            trace.captured = True
            trace.end_serial = self.allocator.next_serial
            for buffer in trace.buffers:
                buffer.traces.add(trace.id)

    def execute_trace(self, trace_id: MeshTraceId, cq: int, blocking: bool) -> None:
        with self.condition:
            trace = self._trace(trace_id)
            if not trace.captured:
                raise RuntimeError(f"{trace.label()} is still being captured")
            if self._capture_on(cq):
                raise RuntimeError(f"CQ{cq} is capturing a trace; it cannot replay {trace.label()}")
            self._fault_point("execute_trace", "execute_trace")
            hazards = self._unsafe_allocations(trace)
            last = None
            for program in trace.programs:
                last, found = self._enqueue(
                    cq,
                    program.name,
                    reads=[self._at_address(b) for b in program.reads],
                    writes=[self._at_address(b) for b in program.writes],
                    effect=program.kernel,
                    trace=trace.id,
                )
                hazards += found
            self.scheduler.enqueued(self)
            self._report(hazards)
            if blocking and last is not None:
                self.scheduler.block_until(self, last)
                self._host_saw(last)

    def release_trace(self, trace_id: MeshTraceId) -> None:
        with self.condition:
            trace = self._trace(trace_id)
            trace.released = True
            for buffer in trace.buffers:
                buffer.traces.discard(trace.id)

    def _trace(self, trace_id: MeshTraceId) -> Trace:
        trace = self._traces.get(int(trace_id))
        if trace is None or trace.released:
            raise RuntimeError(
                f"Trace with id {int(trace_id)} does not exist (released or never captured)"
            )
        return trace

    def _at_address(self, buffer: Buffer) -> Buffer:
        """Replay ignores the allocator: a freed buffer's bytes belong to whoever holds them now."""
        if buffer.allocated:
            return buffer
        holders = self.allocator.overlapping(buffer.address, buffer.size)
        return holders[0] if holders else buffer

    def _unsafe_allocations(self, trace: Trace) -> list[Hazard]:
        """Like TT_METAL_TRACE_ALLOC_TRACKING: buffers allocated after capture, alive at replay."""
        own = trace.buffers
        hazards = []
        for buffer in self.allocator.live:
            if (
                buffer.serial >= trace.end_serial
                and buffer not in own
                and buffer.serial not in trace.warned
            ):
                trace.warned.add(buffer.serial)
                hazards.append(
                    Hazard(
                        HazardKind.TRACE_UNSAFE_ALLOCATION,
                        f"{buffer.label} was allocated after {trace.label()} was captured "
                        "and is alive "
                        "at its replay: the replay may write over it",
                        buffers=(buffer.label,),
                        queues=(trace.cq,),
                    )
                )
        return hazards

    # --- methods of device tensors (signature-checked like the real ttnn.Tensor methods) ---------
    def tensor_cpu(
        self, tensor: DeviceTensor, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> ttnn.Tensor:
        self.hazards.raise_deferred()
        bound = _TENSOR_CPU.bind(args, kwargs)
        return self.read(
            tensor,
            cq=_cq(bound.get("cq_id")),
            blocking=bool(bound.get("blocking", True)),
            name="cpu",
        )

    def tensor_deallocate(
        self, tensor: DeviceTensor, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        self.hazards.raise_deferred()
        bound = _TENSOR_DEALLOCATE.bind(args, kwargs)
        self.deallocate(tensor, force=bool(bound.get("force", False)))

    # --- copying (snapshot.py) -------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The device as data: the lock and the close hooks are not state (restore makes its own),
        and the pending readbacks, registered outside the device, travel with it."""
        policy = getattr(self.scheduler, "policy", self.scheduler)  # a gated device's: its own
        if not isinstance(policy, ManualScheduler) or self.closed:
            raise pickle.PicklingError(
                f"cannot snapshot a {'closed ' if self.closed else ''}device under "
                f"{type(self.scheduler).__name__}: only an open device that advances when told "
                "(ManualScheduler and its seeded subclasses, in the host's process or gating a "
                "device process) has a state to copy")
        state = self.__dict__.copy()
        # A gated device process is not state: the copy starts its own, gated by a copy of the
        # policy, on a copy of DRAM (`__setstate__`); until then it runs in the host.
        state["scheduler"], state["executor"] = policy, InHost()
        state["_device_process"] = policy is not self.scheduler
        state["_views"] = {}  # views of this device's DRAM: a copy makes its own
        state["on_close"] = []
        state["readbacks"] = [(r.command, r.host()) for r in self.readbacks.pending()]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        pending = state.pop("readbacks")
        gated = state.pop("_device_process", False)
        self.__dict__.update(state)
        self.readbacks = PendingReadbacks(self)
        if gated:  # the copy's own device process, from its DRAM and its queues as they are
            policy = self.scheduler
            assert isinstance(policy, ManualScheduler)
            self.scheduler = ProcessScheduler(policy=policy)
            self.scheduler.attach(self)
        for command, host in pending:
            if host is not None:
                on_drop = self._readback_dropped if isinstance(host, HostReadback) else None
                self.readbacks.register(command, host, on_drop=on_drop)
        OPEN.add(self)  # a copy is an open device until closed

    def discard(self) -> None:
        """Close a copy nobody will use again, without completing its queues (emulated only)."""
        if self.closed:
            return
        with self.condition:
            self.closed = True
            self.queues = [deque() for _ in self.queues]  # never to complete: nothing may
            self._views.clear()  # they view DRAM the allocator hands on
        self.scheduler.close()  # a gated copy's device process stops with it
        self.readbacks.forget_all()
        self.allocator.recycle()
        OPEN.discard(self)
        for hook in self.on_close:
            hook(self)

    # --- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Complete what is queued, then close; the close hooks run even if completing raised."""
        if self.closed:
            return
        try:
            with self.condition:
                self.drain()
        except RuntimeError:
            if self.faults.lost is None:
                raise  # a lost device (its process gone) has nothing left to complete
        finally:
            with self.condition:
                self.closed = True
            self.scheduler.close()
            self.readbacks.forget_all()
            OPEN.discard(self)
            for hook in self.on_close:
                hook(self)


def _check_same_spec(host: ttnn.Tensor, device: DeviceTensor, op: str) -> None:
    if not isinstance(device, DeviceTensor):
        raise TypeError(
            f"{op}: expected a device tensor of the emulated device, got {type(device).__name__}"
        )
    if host.storage_type() != ttnn.StorageType.HOST:
        raise RuntimeError(f"{op}: the host tensor must be on host")
    if tuple(host.shape) != tuple(device.shape) or host.dtype != device.dtype:
        raise RuntimeError(
            f"{op}: host and device tensors must have the same shape and dtype "
            f"(host {host.shape} {host.dtype}, device {device.shape} {device.dtype})"
        )
    # As on the chip: the layouts must match. Off chip a host tensor can only be ROW_MAJOR (sizing
    # tiles needs the chip), so a TILE device tensor is written by an op, never by the host.
    if host.layout != device.layout:
        raise RuntimeError(
            f"{op}: host and device tensors must have the same layout (host {host.layout.name}, "
            f"device {device.layout.name})"
        )


def _host_target(read: HostRead) -> torch.Tensor | None:
    """Where a read's elements land: its host tensor's storage (None: the host dropped it)."""
    host = read.target()
    return None if host is None else host_operand(host, read.source)

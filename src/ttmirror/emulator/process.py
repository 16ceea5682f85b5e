"""The emulated device's command processor in a process of its own, as a chip's cores are.

`ProcessScheduler` starts a device process when its device opens and stops it when the device
closes. The host side keeps what the host of a chip keeps: the ttnn API, signature binding and
the support tables (a refused call never crosses), the allocator's books, the hazard detector
and the command records. Each command it enqueues crosses as data (its queue, its index, the
event it waits for, its effect); the device process runs every queue's commands in order, as
soon as their events allow, on its own interpreter, so its kernels never take the host's GIL.

- DRAM is shared memory (torch's, `Tensor.share_memory_`): the device process reads and writes
  it; in the host only the emulator's own observers (`device.observers`, the conformance
  harness) look at it, issuing no command. The TT code reaches it only through ttnn calls.
- Completions come back through shared memory too: per queue, how many of its commands have
  completed. The host retires completed commands (marks them done, runs its observers, lands a
  readback's bytes in its host tensor) whenever it enters the device, and blocks on a reply from
  the device process only where ttnn blocks.
- A readback's bytes are copied by the device process, when the read completes, into a staging
  area of shared memory, and from there into the host tensor when the host retires the read.
- Objects a kernel takes by reference (a model, a drafter: anything not plain data) cross once
  and are named by a number after that: what the host changes in them later, or what a kernel
  changes in them there (the decoder's `ComputeClock`), the other side does not see.
- A device process that dies is a device fault: every later call on the device raises
  `RuntimeError` (as a chip's TT_THROW), the steps in flight fail with it (spec rule 12).

Emulated only: on a chip the device is the chip, and none of this runs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .allocator import Buffer, DramAllocator
from .commands import (
    Command,
    Effect,
    HostRead,
    HostWrite,
    Kernel,
    ReadToStaging,
    WriteBytes,
    apply,
)
from .schedulers import ManualScheduler
from .tensors import Operand, Region, host_operand, kept_view

if TYPE_CHECKING:
    from .device import EmulatedMeshDevice, Scheduler

PLAIN_TYPES = frozenset({Operand, Region, int, float, bool, str, bytes, type(None), torch.dtype,
                         tuple, slice, dict, list})
"""What crosses by value in a kernel's arguments and parameters (a dict or list with all it
holds); any other object crosses once, by reference (a model, a drafter, a clock, a ttnn data
type: what the kernel keeps across commands, not data of one command)."""
STAGING_BYTES = 8 << 20
"""Shared memory for readbacks in flight (a probe step reads a few hundred bytes)."""
BACKLOG = 0
"""Commands the device process may have left before the host sends it what it holds (2 was
measured no better than 0 in `make bench-engine`'s sweep, within its round-to-round spread)."""
STATS = 3
"""Per queue in the control block: commands completed, busy nanoseconds, CPU nanoseconds."""
PRELOAD = ["ttmirror.emulator", "ttmirror.emulator.decoder"]
"""Imported once by the fork server, so a device process starts in milliseconds with every
kernel registered."""


class DeviceProcessDied(RuntimeError):
    """The device process is gone: what a host call on the device raises from then on."""


# --- what crosses ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ref:
    """An object that crossed once (a model, a drafter), named by its number."""

    number: int


class _Objects:
    """The host's numbering of objects that cross by reference; each is sent once."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[int, Any]] = {}  # id -> (number, the object: held)
        self.new: list[tuple[int, bytes]] = []

    def ref(self, value: Any) -> Any:
        if type(value) in PLAIN_TYPES:
            return value
        found = self.known.get(id(value))
        if found is None:
            found = self.known[id(value)] = (len(self.known), value)  # held: ids stay unique
            self.new.append((found[0], pickle.dumps(value, protocol=5)))
        return _Ref(found[0])

    def taken(self) -> list[tuple[int, bytes]]:
        new, self.new = self.new, []
        return new


def _resolve(value: Any, objects: dict[int, Any]) -> Any:
    return objects[value.number] if type(value) is _Ref else value


# --- the messages ---------------------------------------------------------------------------------
Shipped = Kernel | WriteBytes | ReadToStaging | None
"""What a command does in the device process (None: nothing, an event's record); its kernel's
arguments and parameters that are not plain data name objects that crossed once (`_Ref`)."""


@dataclass(frozen=True)
class Queued:
    """One command as the device process runs it: its queue and index there, the command it
    waits for (an event's: queue and index), its configured time and stall, and its effect."""

    cq: int
    index: int
    waits: tuple[int, int] | None
    cost: float
    stall: float
    effect: Shipped


@dataclass(frozen=True)
class Commands:
    """Host -> device: commands to queue, and the objects they name that cross for the first
    time (number, pickled)."""

    queued: tuple[Queued, ...]
    objects: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True)
class Wait:
    """Host -> device: answer `tag` once queue `cq` has completed command `index`."""

    cq: int
    index: int
    tag: int


@dataclass(frozen=True)
class Allow:
    """Host -> device (gated): queue `cq` may run up to command `index`; answer `tag` once it
    has."""

    cq: int
    index: int
    tag: int


@dataclass(frozen=True)
class Close:
    """Host -> device: stop."""


@dataclass(frozen=True)
class Reached:
    """Device -> host: what the message tagged `tag` waited for has completed."""

    tag: int


@dataclass(frozen=True)
class Failed:
    """Device -> host: the error that stopped the device process."""

    why: str


ToDevice = Commands | Wait | Allow | Close
ToHost = Reached | Failed


def _shipped(effect: Effect | None, staging: int | None, objects: _Objects) -> Shipped:
    """An effect as the device process runs it: a kernel, a write's bytes, a read's staging."""
    if isinstance(effect, Kernel):
        params = {k: objects.ref(v) for k, v in effect.params.items()}
        return Kernel(effect.name, tuple(objects.ref(a) for a in effect.args),
                      tuple(effect.outputs), params)
    if isinstance(effect, HostWrite):
        values = effect.values.contiguous()
        raw = values.view(torch.uint8).numpy().tobytes() if values.numel() else b""
        return WriteBytes(effect.destination, raw, values.dtype, tuple(values.shape))
    if isinstance(effect, HostRead):
        assert staging is not None
        return ReadToStaging(effect.source, staging)
    return None


def _put(conn: Connection, message: ToDevice | ToHost) -> None:
    """A message to the other side: plain pickle (nothing in one needs multiprocessing's own
    pickler, which takes twice as long per message)."""
    conn.send_bytes(pickle.dumps(message, protocol=5))


def _get(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


# --- the device process ---------------------------------------------------------------------------
class _DeviceLoop:
    """The device process's state: each queue's commands not yet run, the host's waits, how far
    a gated queue may run, when a held queue's head began to be held, the objects that crossed,
    and views of DRAM."""

    def __init__(self, conn: Connection, memory: torch.Tensor, control: torch.Tensor,
                 stage: torch.Tensor, queues: int, gated: bool) -> None:
        self.conn, self.memory, self.stage = conn, memory, stage
        self.counters = control.numpy()
        self.pending: list[deque[Queued]] = [deque() for _ in range(queues)]
        self.waiters: list[Wait | Allow] = []  # what the host blocks on
        self.allowed = [-1 if gated else math.inf] * queues  # per queue: the last index to run
        self.since: list[float | None] = [None] * queues  # when a held queue's head was held
        self.objects: dict[int, Any] = {}
        self.views: dict[Operand, torch.Tensor] = {}

    def view(self, operand: Operand) -> torch.Tensor:
        return kept_view(self.views, self.memory, operand)

    def apply(self, effect: Shipped) -> None:
        """Do what one command says, on DRAM (a read: into the staging area)."""
        if effect is not None:
            apply(effect, self.view, self.staged, lambda value: _resolve(value, self.objects))

    def staged(self, read: ReadToStaging) -> torch.Tensor:
        """Where a read's elements go: its range of the staging area, shaped as its source."""
        data = self.view(read.source)
        nbytes = data.numel() * data.element_size()
        return self.stage[read.offset:read.offset + nbytes].view(data.dtype).view(data.shape)

    def answer_waiters(self) -> None:
        for w in [w for w in self.waiters if self.counters[w.cq, 0] >= w.index]:
            self.waiters.remove(w)
            _put(self.conn, Reached(w.tag))

    def run_ready(self, cq: int) -> bool:
        """Run queue `cq`'s heads while they may run; whether one did."""
        queue, ran, counters = self.pending[cq], False, self.counters
        while queue:
            head = queue[0]
            waits = head.waits
            if head.index > self.allowed[cq] or (
                    waits is not None and counters[waits[0], 0] < waits[1]):
                break
            began = now = time.perf_counter()
            if head.cost or head.stall:  # held from its first turn: its stall, then its time
                held = self.since[cq]
                began = self.since[cq] = now if held is None else held
                if now < began + head.stall + head.cost:
                    break
                self.since[cq] = None
            cpu = time.thread_time_ns()
            self.apply(head.effect)
            queue.popleft()
            counters[cq, 2] += time.thread_time_ns() - cpu
            counters[cq, 1] += int((time.perf_counter() - began - head.stall) * 1e9)  # not busy
            counters[cq, 0] = head.index  # published last: the host reads it unlocked
            ran = True
            if self.waiters:
                self.answer_waiters()
        return ran

    def take(self, message: ToDevice) -> bool:
        """A message from the host; False: it says to stop."""
        if type(message) is Commands:
            for number, data in message.objects:
                self.objects[number] = pickle.loads(data)
            for queued in message.queued:
                self.pending[queued.cq].append(queued)
        elif type(message) is Wait:
            self.waiters.append(message)
            self.answer_waiters()
        elif type(message) is Allow:  # gated: run one more command of a queue, then answer
            self.allowed[message.cq] = message.index
            self.waiters.append(message)
            self.answer_waiters()
        return type(message) is not Close

    def incoming(self, timeout: float) -> bool:
        """Take the host's messages, waiting up to `timeout` for the first, then all that came
        meanwhile; False: the host said to stop, or is gone (so is the device)."""
        try:
            if self.conn.poll(timeout):
                if not self.take(_get(self.conn)):
                    return False
                while self.conn.poll(0):
                    if not self.take(_get(self.conn)):
                        return False
        except (EOFError, OSError):
            return False
        return True

    def idle_timeout(self) -> float:
        """How long to wait for the host's next message: until the first held queue's due time."""
        dues = [t + self.pending[cq][0].stall + self.pending[cq][0].cost
                for cq, t in enumerate(self.since) if t is not None]
        return max(0.0, min(dues) - time.perf_counter()) if dues else 0.5

    def loop(self) -> None:
        """Until the host says to stop: a pass runs every queue's ready heads, then takes in the
        host's messages (at once after a completion: it may unblock another queue)."""
        while True:
            ran = False
            for cq in range(len(self.pending)):
                ran = self.run_ready(cq) or ran
            if not self.incoming(0.0 if ran else self.idle_timeout()):
                return


def _serve(conn: Connection, memory: torch.Tensor, control: torch.Tensor, stage: torch.Tensor,
           queues: int, cpus: frozenset[int] | None, gated: bool) -> None:
    """The device process: run each queue's commands in order as their events allow (and,
    `gated`, only as far as the host allowed: its scheduler chose the completion order).

    One thread, one loop: a pass runs every queue's ready heads, then takes in the host's
    messages; a command with a configured time (or a stall) holds its queue until it is due
    while the other queues go on, as a chip's queues do. Threads per queue would only hand one
    interpreter lock back and forth: every completion that unblocks the other queue cost a
    thread switch (measured: a quarter of the device process's time in notify and wait)."""
    torch.set_num_threads(1)  # tiny kernels: intra-op threads would only spin against the host
    if cpus:
        os.sched_setaffinity(0, cpus)
    device = _DeviceLoop(conn, memory, control, stage, queues, gated)
    loop_cpu = time.thread_time_ns()
    try:
        device.loop()
    except BaseException as error:  # a kernel's error, say: the host learns of it, we end
        with contextlib.suppress(OSError):
            _put(conn, Failed(f"{type(error).__name__}: {error}"))
        os._exit(3)
    # Queue 0's CPU also holds the loop's own (messages, passes): the process's in all.
    counters = device.counters
    counters[0, 2] += time.thread_time_ns() - loop_cpu - int(counters[:, 2].sum())


# --- the host side --------------------------------------------------------------------------------
_CONTEXT: Any = None


def _context() -> Any:
    """The fork server's context: started once per host process, the emulator preloaded."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


class ProcessScheduler:
    """Runs the device's queues in a device process: real concurrency off the host's GIL.

    With a `policy` (a `ManualScheduler` or one of its subclasses), the device process runs a
    command only when the policy completes it (`device.step`, which then waits for the device
    process to have run it): the manual, seeded and timed completion orders across the
    boundary, each as it is in the host's process.

    `costs` gives named commands a device time, as `ThreadedScheduler`'s does: the device
    process holds the command's queue that long before it completes it. `cpus`: the cores the
    device process may run on (`os.sched_setaffinity`; default: any), so a benchmark can give
    it cores of its own, as a chip's are, instead of the OS time-slicing it with the host."""

    def __init__(self, costs: Mapping[str, float] | None = None, *,
                 cpus: frozenset[int] | None = None,
                 policy: Scheduler | None = None) -> None:
        self.costs: Mapping[str, float] = costs or {}
        if policy is not None and not isinstance(policy, ManualScheduler):
            raise ValueError("the device process runs commands as a ManualScheduler (or a "
                             "subclass) completes them, or on its own (ProcessScheduler), not "
                             f"as a {type(policy).__name__} does")
        if policy is not None and costs:
            raise ValueError("ProcessScheduler: with a policy, the policy says when commands "
                             "complete: give it the command times, not `costs`")
        self.policy = policy if isinstance(policy, ManualScheduler) else None
        if cpus is not None and (not cpus or not cpus <= set(range(os.cpu_count() or 1))):
            raise ValueError(f"ProcessScheduler: cpus {sorted(cpus)} must be a non-empty set of "
                             f"this machine's cores 0 to {(os.cpu_count() or 1) - 1}")
        self.cpus = cpus
        self._device: EmulatedMeshDevice | None = None
        self._process: Any = None
        self._conn: Connection | None = None
        self._control: torch.Tensor | None = None
        self._counters: np.ndarray | None = None
        self._staging: torch.Tensor | None = None
        self._sent = [0, 0]  # per queue: the index of the last command sent
        self._stalls: dict[int, float] = {}  # command id -> its stall, until sent
        self._reads: dict[int, Buffer] = {}  # command id -> its staging range
        self._books = DramAllocator(STAGING_BYTES)  # the staging area's ranges, as DRAM's
        self._objects = _Objects()
        self._tags = 0
        self._reached: set[int] = set()
        self._replies = threading.Condition()  # guards _reached and _why
        self._receiver: threading.Thread | None = None
        self.failure: str | None = None
        self._why: str | None = None  # the device process's own error, if it sent one
        self.cpu_s: dict[int, float] = {}
        """Each queue's CPU seconds in the device process, set when the device closes."""
        self.busy_s: dict[int, float] = {}
        """Seconds each queue was busy (configured times included), set when the device closes."""

    # --- lifetime ---------------------------------------------------------------------------------
    def attach(self, device: EmulatedMeshDevice) -> None:
        self._device = device
        queues = device.num_command_queues
        # Shared memory that torch owns: mapped in both processes, unmapped with its last tensor.
        device.allocator.share(torch.empty(max(1, device.allocator.size), dtype=torch.uint8)
                               .share_memory_())
        self._control = torch.zeros((queues, STATS), dtype=torch.int64).share_memory_()
        self._counters = self._control.numpy()
        self._books.share(torch.empty(STAGING_BYTES, dtype=torch.uint8).share_memory_())
        self._staging = self._books.memory
        host, child = _context().Pipe()
        self._process = _context().Process(
            target=_serve,
            args=(child, device.allocator.memory, self._control, self._staging, queues,
                  self.cpus, self.policy is not None),
            name="emulated-device", daemon=True)
        # A restored copy's queues hold commands its own process has not seen: they are sent
        # from the first on, and what completed before them is what the counters start at.
        for cq, queue in enumerate(device.queues):
            done = queue[0].index - 1 if queue else device.ordering.enqueued[cq]
            self._sent[cq] = done
            self._counters[cq, 0] = done
        self._process.start()
        child.close()
        self._conn = host
        self._receiver = threading.Thread(target=self._receive, name="emulated-device-replies",
                                          daemon=True)
        self._receiver.start()
        if self.policy is not None:
            self.lock = device.condition  # the device's lock, now this executor's
            device.executor = self
            self.policy.attach(device)

    def close(self) -> None:
        if self.policy is not None:
            self.policy.close()
        if self._conn is not None:
            with contextlib.suppress(OSError):
                _put(self._conn, Close())
        if self._process is not None:
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        if self._counters is not None:
            for cq in range(self._counters.shape[0]):
                self.busy_s[cq] = int(self._counters[cq, 1]) / 1e9
                self.cpu_s[cq] = int(self._counters[cq, 2]) / 1e9
        if self._conn is not None:
            self._conn.close()
        if self._receiver is not None:
            self._receiver.join(timeout=5)
        self._counters = None
        self._control = None
        self._staging = None

    def kill(self) -> None:
        """End the device process now, as a chip that stops answering (emulated only)."""
        if self._process is not None:
            self._process.kill()
            self._process.join()

    # --- the Scheduler protocol ---------------------------------------------------------------
    def enqueued(self, device: EmulatedMeshDevice) -> None:
        if self.policy is not None:
            self.policy.enqueued(device)
            return
        self._retire(device)
        self._send(device, now=False)

    def block_until(self, device: EmulatedMeshDevice, command: Command) -> None:
        if self.policy is not None:
            self.policy.block_until(device, command)
            return
        self._send(device)
        self._retire(device)
        if command.done:
            return
        self._await(device, lambda tag: Wait(command.cq, command.index, tag))
        self._retire(device)
        assert command.done, command

    def stall(self, device: EmulatedMeshDevice, command: Command, seconds: float) -> None:
        if self.policy is not None:
            self.policy.stall(device, command, seconds)
            return
        self._stalls[command.id] = seconds

    # --- the executor of a gated device (`device.step`) ---------------------------------------
    lock: threading.Condition
    """Gated: the device's lock (`device.condition`), which this executor holds from attach."""

    def apply(self, device: EmulatedMeshDevice, head: Command) -> None:
        """Run `head`, its queue's ready head, in the device process and land its readback; the
        device then marks it done (with a policy: the policy chose it)."""
        self._send(device)
        self._await(device, lambda tag: Allow(head.cq, head.index, tag))
        self._land(head)

    # --- inside ---------------------------------------------------------------------------------
    def _await(self, device: EmulatedMeshDevice, message: Callable[[int], Wait | Allow]) -> None:
        """Send `message(tag)` and wait for the device process to answer that its command
        completed: free-running, with the device lock released (other host threads go on, as
        beside a chip); gated, holding it, so that a step is one move, as in the host's
        process (no other thread steps the same head meanwhile)."""
        self._tags += 1
        tag = self._tags
        self._post(message(tag))
        wait = device.condition if self.policy is None else self._replies
        with self._replies:
            while tag not in self._reached:
                self._check_alive(device)
                if wait is self._replies:
                    wait.wait(timeout=0.5)
                else:
                    self._replies.release()  # never hold it while waiting on the device lock
                    try:
                        wait.wait(timeout=0.5)
                    finally:
                        self._replies.acquire()
            self._reached.discard(tag)

    def _post(self, message: ToDevice) -> None:
        assert self._conn is not None
        try:
            _put(self._conn, message)
            return
        except OSError:
            pass
        # Raised outside the handler: the failed send's frames (which hold the pickled message's
        # buffer) must not stay reachable from a traceback cycle.
        self._died()

    def _send(self, device: EmulatedMeshDevice, *, now: bool = True) -> None:
        """Every command enqueued since the last send crosses, in one message. Unless `now`,
        only while the device process is nearly idle (at most `BACKLOG` commands sent and not
        completed): a busy one gets the batch at a later call, one message instead of one per
        command, and it is sent before the device runs dry."""
        counters = self._counters
        assert counters is not None
        if not now and sum(sent - int(counters[cq, 0])
                           for cq, sent in enumerate(self._sent)) > BACKLOG:
            return
        records = []
        for cq, queue in enumerate(device.queues):
            # The unsent commands are the queue's tail (indices are consecutive on a queue).
            unsent = queue[-1].index - self._sent[cq] if queue else 0
            for command in itertools.islice(queue, len(queue) - unsent, None):
                effect = command.effect
                staging = self._stage(command) if isinstance(effect, HostRead) else None
                waits = None
                if command.waits and command.event is not None:
                    record = command.event.record
                    waits = (record.cq, record.index)
                records.append(Queued(cq, command.index, waits, self.costs.get(command.name, 0.0),
                                      self._stalls.pop(command.id, 0.0),
                                      _shipped(effect, staging, self._objects)))
                self._sent[cq] = command.index
        if records:
            self._post(Commands(tuple(records), tuple(self._objects.taken())))

    def _stage(self, command: Command) -> int:
        """A staging range for a read's bytes (aligned, as a DRAM buffer)."""
        effect = command.effect
        assert isinstance(effect, HostRead)
        source = effect.source
        buffer = self._books.allocate(math.prod(source.shape) * source.region.dtype.itemsize)
        self._reads[command.id] = buffer
        return buffer.address

    def _retire(self, device: EmulatedMeshDevice) -> None:
        """Retire what the device process completed: done flags, observers, readbacks landed."""
        counters = self._counters
        if counters is None:
            return
        for cq, queue in enumerate(device.queues):
            reached = int(counters[cq, 0])
            while queue and queue[0].index <= reached:
                self._land(queue[0])
                device.retire(cq)

    def _land(self, head: Command) -> None:
        """A completed read's bytes, from the staging area into its host tensor."""
        effect = head.effect
        if isinstance(effect, HostRead):
            staged = self._reads.pop(head.id)
            host = effect.target()
            if host is not None:  # else dropped: a hazard already, it lands nowhere
                assert self._staging is not None
                target = host_operand(host, effect.source)
                nbytes = target.numel() * target.element_size()
                view = self._staging[staged.address:staged.address + nbytes]
                target.copy_(view.view(target.dtype).view(target.shape))
            self._books.free(staged)

    def _receive(self) -> None:
        """Replies from the device process: a blocked host call's command reached, or the
        error that stopped it."""
        conn, device = self._conn, self._device
        assert conn is not None and device is not None
        while True:
            try:
                message = _get(conn)
            except (EOFError, OSError):
                break
            with self._replies:
                if type(message) is Failed:  # what stopped it: the host's error names it
                    self._why = message.why
                else:
                    self._reached.add(message.tag)
                self._replies.notify_all()
            self._wake_host(device)
        with self._replies:
            self._replies.notify_all()
        self._wake_host(device)

    def _wake_host(self, device: EmulatedMeshDevice) -> None:
        """A free-running device's host waits on the device lock: wake it (a gated one's host
        holds that lock while it waits, on the replies' own)."""
        if self.policy is None:
            with device.condition:
                device.condition.notify_all()

    def _check_alive(self, device: EmulatedMeshDevice) -> None:
        if self._process is not None and not self._process.is_alive():
            self._died()

    def _died(self) -> None:
        code = None if self._process is None else self._process.exitcode
        self.failure = f"the emulated device's process ended (exit code {code})" + (
            f": {self._why}" if self._why else "")
        device = self._device
        if device is not None:
            device.faults.lose(self.failure, injected=False)
        raise DeviceProcessDied(f"TT_FATAL: {self.failure}")

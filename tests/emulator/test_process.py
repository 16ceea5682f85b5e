"""The emulated device in a process of its own (`ProcessScheduler`): the same data as in the
host's process, DRAM in shared memory the host reaches only through ttnn calls (its observers
excepted), late reads, and a device process that dies is a device fault."""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
import time
from dataclasses import replace

import pytest

from ttmirror.emulator import (
    ManualScheduler,
    ProcessScheduler,
    SeededScheduler,
    ThreadedScheduler,
    snapshot,
)
from ttmirror.emulator.commands import Command, Kernel, Program, register_kernel
from ttmirror.impl.probe import ProbeSpec
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.workload import run_workload, standard_plan

from .conftest import host_ids, on_device, open_emulated, values_of


def test_the_device_process_computes_what_the_host_would() -> None:
    dev = open_emulated(scheduler=ProcessScheduler)
    tt = dev.api
    try:
        assert dev.allocator.memory.is_shared()
        a, b = on_device(dev, [1, 2, 3]), on_device(dev, [0, 0, 0])
        tt.synchronize_device(dev)  # b's upload (CQ0) before CQ1 writes it
        tt.plus_one(a)
        tt.copy_host_to_device_tensor(host_ids([7, 8, 9]), b, cq_id=1)
        assert values_of(tt.from_device(a)) == [2, 3, 4]
        assert values_of(tt.from_device(b, queue_id=1)) == [7, 8, 9]
        assert dev.hazards.total == 0 and dev.pending() == 0
    finally:
        tt.close_mesh_device(dev)


def test_an_observer_sees_the_device_processs_data_as_each_command_retires() -> None:
    dev = open_emulated(scheduler=ProcessScheduler)
    tt = dev.api
    seen: list[list[int]] = []
    try:
        a = on_device(dev, [4, 5])

        def look(command: Command) -> None:  # reads shared DRAM, issues no command
            if command.name == "plus_one":
                seen.append([int(v) for v in dev.view(a.operand).reshape(-1).tolist()])

        dev.observers.append(look)
        tt.plus_one(a)
        tt.plus_one(a)
        tt.synchronize_device(dev)
        # The host retires what the device process completed when it next enters the device:
        # an observer sees DRAM as of then, at least the command's own result.
        assert seen in ([[5, 6], [6, 7]], [[6, 7], [6, 7]])
    finally:
        tt.close_mesh_device(dev)


def test_a_late_read_lands_after_its_stall() -> None:
    dev = open_emulated(scheduler=ProcessScheduler)
    tt = dev.api
    try:
        a = on_device(dev, [5, 6])
        tt.synchronize_device(dev)
        dev.faults.arm("read", stall_s=0.3)
        began = time.monotonic()
        host = tt.from_device(a, blocking=False, queue_id=1)
        read = tt.record_event(dev, 1)
        tt.event_synchronize(read)
        assert time.monotonic() - began >= 0.3
        assert tt.to_torch(host).reshape(-1).tolist() == [5, 6]
        assert dev.faults.injected["stall"] == 1 and a.is_allocated()
    finally:
        tt.close_mesh_device(dev)


def test_a_held_queue_holds_only_itself() -> None:
    # plus_one holds CQ0 for 30 s, far longer than anything here waits: a read on CQ1 completes
    # meanwhile, with the plus_one still queued.
    scheduler = ProcessScheduler({"plus_one": 30.0})
    dev = open_emulated(scheduler=lambda: scheduler)
    tt = dev.api
    try:
        a, b = on_device(dev, [1, 2]), on_device(dev, [7, 8])
        tt.synchronize_device(dev)
        tt.plus_one(a)
        assert values_of(b.cpu(blocking=True, cq_id=1)) == [7, 8]
        assert dev.pending(0) == 1
        scheduler.kill()  # instead of the 30 s a close would wait for
    finally:
        tt.close_mesh_device(dev)


def test_a_queue_is_busy_for_its_configured_time_in_the_device_process() -> None:
    # Ten plus_ones of 20 ms each keep CQ0 busy 0.2 s or more (a bound the machine's speed only
    # adds to), and the device process reports the CPU its commands took.
    scheduler = ProcessScheduler({"plus_one": 0.02})
    dev = open_emulated(scheduler=lambda: scheduler)
    tt = dev.api
    try:
        work = on_device(dev, [0, 0, 0, 0])
        for _ in range(10):
            tt.plus_one(work)
        assert values_of(work.cpu(blocking=True, cq_id=0)) == [10] * 4
    finally:
        tt.close_mesh_device(dev)
    assert scheduler.busy_s[0] >= 10 * 0.02 and scheduler.cpu_s[0] > 0


def test_a_dead_device_process_is_a_device_fault_and_nothing_is_left() -> None:
    before = {p.pid for p in multiprocessing.active_children()}
    dev = open_emulated(scheduler=ProcessScheduler)
    tt = dev.api
    try:
        a = on_device(dev, [1, 2])
        tt.synchronize_device(dev)
        scheduler = dev.scheduler
        assert isinstance(scheduler, ProcessScheduler)
        scheduler.kill()
        with pytest.raises(RuntimeError, match=r"process ended \(exit code -9\)"):
            tt.plus_one(a)
            tt.synchronize_device(dev)
        # From then on every call fails alike, as on a chip that stopped answering.
        with pytest.raises(RuntimeError, match="process ended"):
            tt.plus_one(a)
    finally:
        tt.close_mesh_device(dev)
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_a_kernel_that_fails_in_the_device_process_is_named_in_the_devices_error() -> None:
    """A kernel the device process does not have (registered in the host only, after it
    started): the process stops, and the host's error says why."""
    register_kernel("host_only", lambda args, outputs, params: None)
    dev = open_emulated(scheduler=ProcessScheduler)
    tt = dev.api
    try:
        a = on_device(dev, [1])
        kernel = Kernel("host_only", (a.operand,), (a.operand,))
        dev.launch(Program("host_only", (a.buffer,), (a.buffer,), kernel, "host_only"), 0)
        with pytest.raises(RuntimeError, match=r"process ended .*: KeyError: 'host_only'"):
            tt.synchronize_device(dev)
    finally:
        tt.close_mesh_device(dev)


@pytest.mark.parametrize(("mode", "trace", "spec"), [
    ("auto", False, 0), ("off", False, 0), ("auto", True, 0), ("auto", False, 2),
    ("auto", True, 2)], ids=["depth2", "depth1", "traced", "drafts", "traced-drafts"])
def test_serving_in_the_device_process_gives_the_host_processs_tokens(
        mode: str, trace: bool, spec: int) -> None:
    """Seeded sampling with logprobs, eager and traced, with and without drafts: the device
    process serves the tokens and logprobs the host's own process does."""
    model = ProbeDecoder(ProbeSpec(seed=5))
    plan = [replace(p, sampling=SamplingParams(seed=3, logprobs=2))
            for p in standard_plan(model.vocab, 6)]
    outs = []
    for scheduler in (ManualScheduler, ProcessScheduler):
        dev = open_emulated(scheduler=scheduler, trace_region_size=1 << 22)
        tt = dev.api
        try:
            engine = ServingEngine(
                ServingBackend(TtBackend(dev), model, SamplingParams(seed=3)),
                ServingConfig(async_scheduling=mode, rows=4, trace=trace, spec_tokens=spec,
                              max_logprobs=2))
            out = run_workload(engine, plan)
            engine.close()
            assert dev.hazards.total == 0
            outs.append(out)
        finally:
            tt.close_mesh_device(dev)
    assert outs[0].tokens == outs[1].tokens and outs[0].logprobs == outs[1].logprobs
    assert outs[1].generated > 20 and outs[1].logprobs
    if spec:
        assert outs[1].stats.get("drafted_rows", 0) > 0


# --- gated: the device process runs what the host's scheduler completes, and only that ---------
def test_a_gated_device_process_completes_commands_in_the_callers_order() -> None:
    """`Emulator(process=True)` with the manual scheduler: nothing runs until a step says so,
    a step runs exactly its queue's head there, and an observer sees DRAM as of that step."""
    dev = open_emulated(process=True)
    tt = dev.api
    seen: list[tuple[str, list[int], list[int]]] = []
    try:
        scheduler = dev.scheduler
        assert isinstance(scheduler, ProcessScheduler) and scheduler.policy is not None
        a, b = on_device(dev, [1, 2]), on_device(dev, [0, 0])
        tt.synchronize_device(dev)  # the uploads (CQ0) before CQ1 writes b

        def look(command: Command) -> None:
            seen.append((command.name, [int(v) for v in dev.view(a.operand).reshape(-1)],
                         [int(v) for v in dev.view(b.operand).reshape(-1)]))

        dev.observers.append(look)
        tt.plus_one(a)  # CQ0
        tt.copy_host_to_device_tensor(host_ids([7, 8]), b, cq_id=1)
        time.sleep(0.2)  # a free-running device process would have run both by now
        assert dev.pending() == 2 and values_of_view(dev, a) == [1, 2]
        dev.step(1)  # the later-enqueued CQ1 write first: the caller's order
        assert seen == [("copy_host_to_device_tensor", [1, 2], [7, 8])]
        dev.step(0)
        assert seen[1] == ("plus_one", [2, 3], [7, 8])
        assert [n for n, *_ in seen] == ["copy_host_to_device_tensor", "plus_one"]
        assert values_of(tt.from_device(a)) == [2, 3] and dev.hazards.total == 0
    finally:
        tt.close_mesh_device(dev)


def values_of_view(dev: object, tensor: object) -> list[int]:
    """A device tensor's elements as the observers see them (shared DRAM, no command)."""
    return [int(v) for v in dev.view(tensor.operand).reshape(-1)]  # type: ignore[attr-defined]


def test_a_seeded_order_is_the_same_in_the_device_process() -> None:
    """The seeded scheduler across the boundary: the same completion order, device data and
    tokens as in the host's process, the order really interleaving the two queues."""
    model = ProbeDecoder(ProbeSpec(seed=5))
    runs = []
    for process in (False, True):
        dev = open_emulated(scheduler=lambda: SeededScheduler(11), process=process)
        tt = dev.api
        queues: list[int] = []
        dev.observers.append(lambda command, seen=queues: seen.append(command.cq))
        try:
            engine = ServingEngine(ServingBackend(TtBackend(dev), model),
                                   ServingConfig(async_scheduling="auto", rows=4))
            out = run_workload(engine, standard_plan(model.vocab, 6))
            engine.close()
            assert dev.hazards.total == 0
            runs.append((out.tokens, list(dev.completion_log), queues))
        finally:
            tt.close_mesh_device(dev)
    assert runs[0] == runs[1]
    switches = sum(1 for x, y in itertools.pairwise(queues) if x != y)
    assert len(queues) > 100 and switches > 10, (len(queues), switches)


def test_a_gated_device_snapshot_restores_into_a_device_process_of_its_own() -> None:
    """Snapshot with commands still queued on both CQs (one awaiting the other's event), then
    restore: the copy has its own device process, started from a copy of DRAM and of the
    queues; stepped alike, original and copy compute the same data, independently; a free-
    running device process has no state to copy (refused); nothing is left behind."""
    before = {p.pid for p in multiprocessing.active_children()}
    dev = open_emulated(process=True)
    tt = dev.api
    copy = None
    try:
        a, b = on_device(dev, [1, 2]), on_device(dev, [10, 20])
        tt.synchronize_device(dev)
        tt.plus_one(a)  # CQ0, queued
        tt.plus_one(a)
        event = tt.record_event(dev, 0)
        tt.wait_for_event(1, event)
        tt.copy_host_to_device_tensor(host_ids([7, 8]), b, cq_id=1)  # after the event
        dev.step(0)  # one plus_one done, one queued: the copy must not redo the first
        pending = dev.pending()
        copy = snapshot.restore(snapshot.snapshot(dev))
        assert isinstance(copy.scheduler, ProcessScheduler) and copy.executor is copy.scheduler
        assert copy.scheduler._process.pid != dev.scheduler._process.pid
        assert copy.pending() == pending == 4
        assert values_of_view(copy, a) == [2, 3]
        for device in (dev, copy):
            with pytest.raises(RuntimeError, match="waits for"):
                device.step(1)  # the barrier: CQ0's event first
            device.step(0)
            device.step(0)  # the event
            device.step(1)
            device.step(1)
        assert values_of_view(dev, a) == values_of_view(copy, a) == [3, 4]
        assert values_of_view(dev, b) == values_of_view(copy, b) == [7, 8]
        tt.plus_one(a)  # the original goes on alone
        tt.synchronize_device(dev)
        assert values_of_view(dev, a) == [4, 5] and values_of_view(copy, a) == [3, 4]
    finally:
        if copy is not None:
            copy.discard()
        tt.close_mesh_device(dev)
    assert {p.pid for p in multiprocessing.active_children()} <= before
    free = open_emulated(scheduler=ProcessScheduler)
    try:
        with pytest.raises(pickle.PicklingError, match=r"cannot snapshot .*ProcessScheduler"):
            snapshot.snapshot(free)
    finally:
        tt.close_mesh_device(free)


def test_a_policy_must_complete_when_told() -> None:
    with pytest.raises(ValueError, match="not as a ThreadedScheduler does"):
        open_emulated(scheduler=ThreadedScheduler, process=True)

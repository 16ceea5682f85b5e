"""The TimedScheduler: per-command device times decide which queue finishes first, on a seeded
clock, so the same seed and calls give the same completion order; a late read lands at a point
of the host's calls, never by the wall clock."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout

import pytest
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, TimedScheduler
from ttmirror.emulator.commands import MeshEvent

from .conftest import host_ids, on_device, open_emulated


def _order(costs: dict[str, float], seed: int = 0, jitter: float = 0.1) -> list[str]:
    """Completion order of a slow-or-fast op on CQ0 beside a write on CQ1, enqueued after it."""
    dev = open_emulated(scheduler=lambda: TimedScheduler(costs, seed, jitter=jitter))
    tt = dev.api
    try:
        a = on_device(dev, [1, 2])
        b = on_device(dev, [3, 4])
        tt.synchronize_device(dev)
        start = len(dev.completion_log)
        tt.plus_one(a)
        tt.copy_host_to_device_tensor(host_ids([7, 8]), b, cq_id=1)
        tt.synchronize_device(dev)
        return [label.split("#")[0] for label in dev.completion_log[start:]]
    finally:
        tt.close_mesh_device(dev)


def test_the_command_times_decide_which_queue_finishes_first() -> None:
    slow_op = _order({"plus_one": 10.0, "copy_host_to_device_tensor": 0.1})
    slow_copy = _order({"plus_one": 0.1, "copy_host_to_device_tensor": 10.0})
    assert slow_op == ["copy_host_to_device_tensor", "plus_one"]
    assert slow_copy == ["plus_one", "copy_host_to_device_tensor"]


def test_the_same_seed_gives_the_same_order_and_seeds_differ() -> None:
    # Equal times, one host call apart (1.0), jittered by up to half of 4.0: the seed decides.
    costs = {"plus_one": 4.0, "copy_host_to_device_tensor": 4.0}
    orders = {tuple(_order(costs, seed, jitter=0.5)) for seed in range(12)}
    assert _order(costs, 3, jitter=0.5) == _order(costs, 3, jitter=0.5)
    assert len(orders) == 2


def test_impossible_times_are_refused() -> None:
    with pytest.raises(ValueError, match="host_s > 0"):
        TimedScheduler(host_s=0)
    with pytest.raises(ValueError, match="0 or more"):
        TimedScheduler({"plus_one": -1.0})


def _stalled_read(dev: EmulatedMeshDevice) -> tuple[ttnn.Tensor, ttnn.Tensor, MeshEvent]:
    """A non-blocking read on CQ1 armed to land late: the device tensor it reads (it must outlive
    the copy), the host tensor and the event recorded after it."""
    tt = dev.api
    a = on_device(dev, [5, 6])
    tt.synchronize_device(dev)
    dev.faults.arm("read", stall_s=1.0)
    host = tt.from_device(a, blocking=False, queue_id=1)
    return a, host, tt.record_event(dev, 1)


def test_a_late_read_is_held_until_the_host_gave_up_then_lands_at_its_next_call() -> None:
    dev = open_emulated(scheduler=lambda: TimedScheduler(seed=0))
    tt = dev.api
    try:
        source, host, read = _stalled_read(dev)
        for _ in range(3):  # host calls go by: the clock runs on, the read stays held
            tt.plus_one(on_device(dev, [1]))
        assert not read.done
        # A waiter beside the host (a readback with a deadline) gives up: no wall-clock stall
        # decides when, only that the read has not landed.
        with ThreadPoolExecutor(1) as waiter:
            wait = waiter.submit(tt.event_synchronize, read)
            with pytest.raises(WaitTimeout):
                wait.result(timeout=0.2)
            assert not read.done
            tt.plus_one(on_device(dev, [2]))  # the host's next call: the read lands in it
            assert read.done
            wait.result(timeout=5)
        assert tt.to_torch(host).reshape(-1).tolist() == [5, 6]
        assert dev.hazards.total == 0 and source.is_allocated()
    finally:
        tt.close_mesh_device(dev)


def test_a_host_that_waits_without_a_deadline_gets_the_late_read_at_once() -> None:
    dev = open_emulated(scheduler=lambda: TimedScheduler(seed=0))
    tt = dev.api
    try:
        source, host, read = _stalled_read(dev)
        tt.event_synchronize(read)
        assert read.done and tt.to_torch(host).reshape(-1).tolist() == [5, 6]
        assert source.is_allocated()
        assert dev.faults.injected["stall"] == 1
    finally:
        tt.close_mesh_device(dev)


def test_a_late_read_lands_after_the_patience_when_the_host_makes_no_call() -> None:
    """The host gave up on the read and waits on the next readback, queued behind it, without a
    call of its own: the held read lands after `patience_s` in the waiter's thread, so that next
    wait does not give up too."""
    dev = open_emulated(scheduler=lambda: TimedScheduler(seed=0, patience_s=0.5))
    tt = dev.api
    try:
        source, host, read = _stalled_read(dev)
        with ThreadPoolExecutor(1) as waiter:  # one waiter, in order, as the mirror's
            first = waiter.submit(tt.event_synchronize, read)
            with pytest.raises(WaitTimeout):
                first.result(timeout=0.1)
            second = waiter.submit(tt.event_synchronize, read)
            second.result(timeout=5)  # no host call in between: the patience lands it
            assert first.done() and read.done
        assert tt.to_torch(host).reshape(-1).tolist() == [5, 6] and source.is_allocated()
    finally:
        tt.close_mesh_device(dev)

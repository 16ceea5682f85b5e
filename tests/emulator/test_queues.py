"""Command queues are FIFO, complete only when advanced; events order queues; host-blocking
calls advance exactly what they must."""

from __future__ import annotations

import pytest
import torch
import ttnn

from ttmirror.emulator import EmulatedMeshDevice

from .conftest import host_ids, on_device, values_of


def test_commands_complete_only_when_the_device_is_advanced(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2])
    tt.plus_one(t)
    assert device.pending(0) == 2 and device.completion_log == []
    assert [c.name for c in device.ready_commands()] == ["to_device"]
    device.step(0)
    assert device.completion_log[-1].startswith("to_device")
    assert device.pending(0) == 1
    device.step(0)
    assert device.pending() == 0
    with pytest.raises(IndexError):
        device.step(0)


def test_each_queue_is_fifo(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [0, -1], ttnn.int32)
    for _ in range(3):
        tt.plus_one(t, skip_negative_entries=True)
    device.drain()
    names = [label.split("#")[0] for label in device.completion_log]
    assert names == ["to_device", "plus_one", "plus_one", "plus_one"]
    assert values_of(tt.from_device(t)) == [3, -1]


def test_a_wait_for_event_blocks_its_queue_until_the_event_completes(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    src = on_device(device, [5])
    tt.synchronize_device(device)
    dst = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    tt.copy_host_to_device_tensor(host_ids([9]), src, cq_id=1)
    written = tt.record_event(device, 1)
    tt.wait_for_event(0, written)
    with tt.command_queue(0):
        tt.copy(src, dst)
    # CQ0's head is the barrier; it is not ready until CQ1 has run the write and the record.
    assert [c.cq for c in device.ready_commands()] == [1]
    with pytest.raises(RuntimeError, match="waits for"):
        device.step(0)
    device.step(1)
    device.step(1)
    assert [c.cq for c in device.ready_commands()] == [0]
    device.step(0)
    device.step(0)
    assert values_of(tt.from_device(dst)) == [9]


def test_without_the_event_the_copy_may_read_the_old_value(device: EmulatedMeshDevice) -> None:
    # The twin of the test above, minus the wait: the device may run CQ0 first (real wrong data).
    tt = device.api
    device.hazards.mode = "count"
    src = on_device(device, [5])
    tt.synchronize_device(device)
    dst = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    tt.copy_host_to_device_tensor(host_ids([9]), src, cq_id=1)
    tt.copy(src, dst)
    device.step(0)  # CQ0 runs before CQ1's write: nothing stops it
    device.step(1)
    assert values_of(tt.from_device(dst)) == [5]
    assert device.hazards.counts["read-after-write"] == 1


def test_blocking_read_advances_exactly_what_it_must(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a = on_device(device, [1])
    tt.plus_one(a)
    b = tt.from_torch(
        torch.tensor([[2]], dtype=torch.int32), dtype=ttnn.uint32, device=device, cq_id=1
    )
    assert device.pending() == 3
    # A blocking read of `b` on CQ1 completes CQ1 up to the read, and nothing of CQ0.
    assert values_of(tt.from_device(b, queue_id=1)) == [2]
    assert device.pending(0) == 2 and device.pending(1) == 0
    # On CQ0 it completes what precedes it there, not what follows.
    host = tt.from_device(a, queue_id=0)
    tt.plus_one(a)
    assert values_of(host) == [2] and device.pending(0) == 1


def test_event_synchronize_completes_the_other_queue_it_waits_on(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    t = on_device(device, [1])
    tt.synchronize_device(device)
    tt.copy_host_to_device_tensor(host_ids([40]), t, cq_id=1)
    unrelated = on_device(device, [0])  # CQ0 work enqueued before the barrier
    written = tt.record_event(device, 1)
    tt.wait_for_event(0, written)
    tt.plus_one(t)
    tt.plus_one(unrelated)  # before the recorded event: must complete
    done = tt.record_event(device, 0)
    tt.plus_one(t)  # after the event: must stay pending
    tt.event_synchronize(done)
    assert device.pending(1) == 0
    assert device.pending(0) == 1
    assert done.done
    assert [c.name for c in device.queues[0]] == ["plus_one"]  # the one after the event
    assert values_of(tt.from_device(t)) == [42]


def test_synchronize_device_drains_one_queue_or_all(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a = on_device(device, [1])
    b = tt.from_torch(
        torch.tensor([[2]], dtype=torch.int32), dtype=ttnn.uint32, device=device, cq_id=1
    )
    tt.synchronize_device(device, cq_id=1)
    assert device.pending(1) == 0 and device.pending(0) == 1
    tt.synchronize_device(device)
    assert device.pending() == 0
    assert a.is_allocated() and b.is_allocated()

"""Each hazard: a minimal scenario that must be reported, and its corrected twin that must pass."""

from __future__ import annotations

import gc

import pytest
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, HazardError, HazardKind

from .conftest import host_ids, on_device, values_of


def _synced_pair(device: EmulatedMeshDevice) -> tuple[ttnn.Tensor, ttnn.Tensor]:
    tt = device.api
    a, b = on_device(device, [1, 2]), on_device(device, [0, 0])
    tt.synchronize_device(device)
    return a, b


# --- cross-queue races ---------------------------------------------------------------------------


def test_read_after_write_across_queues_without_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)
    with pytest.raises(HazardError, match="read-after-write") as caught:
        tt.copy(a, b)  # CQ0 reads what CQ1 writes
    assert caught.value.hazard.queues == (1, 0)
    assert any("copy" in c for c in caught.value.hazard.commands)


def test_read_after_write_ordered_by_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)
    tt.wait_for_event(0, tt.record_event(device, 1))
    tt.copy(a, b)
    assert values_of(tt.from_device(b)) == [7, 8]
    assert device.hazards.total == 0


def test_write_after_read_across_queues_without_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy(a, b)  # CQ0 reads a
    with pytest.raises(HazardError, match="write-after-read"):
        tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)


def test_write_after_read_ordered_by_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy(a, b)
    tt.wait_for_event(1, tt.record_event(device, 0))
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)
    assert values_of(tt.from_device(b)) == [1, 2]
    assert device.hazards.total == 0


def test_write_after_write_across_queues_without_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, _ = _synced_pair(device)
    tt.fill(a, 3, output_tensor=a)  # CQ0 writes a
    with pytest.raises(HazardError, match="write-after-write"):
        tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)


def test_write_after_write_ordered_by_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, _ = _synced_pair(device)
    tt.fill(a, 3, output_tensor=a)
    tt.wait_for_event(1, tt.record_event(device, 0))
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)
    assert values_of(tt.from_device(a, queue_id=1)) == [7, 8]
    assert device.hazards.total == 0


def test_same_queue_needs_no_event(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=0)
    tt.copy(a, b)
    assert values_of(tt.from_device(b)) == [7, 8]
    assert device.hazards.total == 0


def test_host_synchronisation_also_orders_queues(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy_host_to_device_tensor(host_ids([7, 8]), a, cq_id=1)
    tt.event_synchronize(tt.record_event(device, 1))
    tt.copy(a, b)
    assert values_of(tt.from_device(b)) == [7, 8]
    assert device.hazards.total == 0


def test_reused_address_inherits_the_freed_buffers_pending_reads(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy(a, b)  # CQ0 will read a, not yet run
    address = a.buffer_address()
    tt.deallocate(a)  # the allocator does not wait for CQ0
    c = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 2]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    assert c.buffer_address() == address  # bottom-up first fit reuses it at once
    with pytest.raises(HazardError, match="write-after-read"):
        tt.copy_host_to_device_tensor(host_ids([7, 8]), c, cq_id=1)


def test_reused_address_after_the_reader_is_known_done(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy(a, b)
    done = tt.record_event(device, 0)
    tt.deallocate(a)
    c = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 2]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    tt.wait_for_event(1, done)
    tt.copy_host_to_device_tensor(host_ids([7, 8]), c, cq_id=1)
    assert values_of(tt.from_device(b)) == [1, 2]
    assert device.hazards.total == 0


# --- use after free ------------------------------------------------------------------------------


def test_read_of_a_freed_buffer_is_reported_and_reads_the_reused_bytes(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    device.hazards.mode = "count"
    a, b = _synced_pair(device)
    tt.deallocate(a)
    other = on_device(device, [55, 66])  # reuses a's address
    assert other.buffer_address() == a.buffer_address()
    tt.copy(a, b)
    assert device.hazards.counts[HazardKind.USE_AFTER_FREE] == 1
    assert values_of(tt.from_device(b)) == [55, 66]  # real wrong data


def test_reading_before_the_free_is_fine(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = _synced_pair(device)
    tt.copy(a, b)
    tt.deallocate(a)  # same CQ runs in order: the copy reads a before anything reuses it
    assert values_of(tt.from_device(b)) == [1, 2]
    assert device.hazards.total == 0


# --- non-blocking readbacks ----------------------------------------------------------------------


def test_host_read_before_the_readback_event_sees_garbage(device: EmulatedMeshDevice) -> None:
    tt = device.api
    device.hazards.mode = "count"
    t = on_device(device, [11, 12])
    host = t.cpu(blocking=False)
    tt.record_event(device, 0)
    assert values_of(host, tt) != [11, 12]  # garbage: the read has not run
    assert device.hazards.counts[HazardKind.UNSYNCHRONISED_READBACK] == 1


def test_host_read_before_sync_raises_in_raise_mode(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [11, 12])
    host = t.cpu(blocking=False)
    with pytest.raises(HazardError, match="unsynchronised-readback"):
        tt.to_torch(host)
    tt.synchronize_device(device)
    assert values_of(host) == [11, 12]


def test_host_read_after_event_synchronize(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [11, 12])
    host = t.cpu(blocking=False)
    event = tt.record_event(device, 0)
    tt.event_synchronize(event)
    assert values_of(host) == [11, 12]
    assert device.hazards.total == 0


def test_copy_device_to_host_tensor_non_blocking_follows_the_same_rule(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    t = on_device(device, [11, 12])
    host = host_ids([0, 0])
    tt.copy_device_to_host_tensor(t, host, blocking=False, cq_id=0)
    with pytest.raises(HazardError, match="unsynchronised-readback"):
        tt.to_torch(host)
    tt.synchronize_device(device)
    assert values_of(host) == [11, 12]


def test_dropping_a_pending_readback_is_reported_at_the_next_call(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    t = on_device(device, [11, 12])
    host = t.cpu(blocking=False)
    event = tt.record_event(device, 0)
    del host
    gc.collect()
    assert device.hazards.counts[HazardKind.DROPPED_READBACK] == 1
    with pytest.raises(HazardError, match="dropped-readback"):
        tt.event_synchronize(event)


def test_dropping_a_readback_after_synchronising_is_fine(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [11, 12])
    host = t.cpu(blocking=False)
    tt.event_synchronize(tt.record_event(device, 0))
    del host
    gc.collect()
    tt.synchronize_device(device)
    assert device.hazards.total == 0

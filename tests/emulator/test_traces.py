"""Trace capture records commands at their addresses; replay re-runs them there."""

from __future__ import annotations

import pytest
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, HazardError, HazardKind

from .conftest import host_ids, on_device, open_emulated, values_of


def _capture_step(
    device: EmulatedMeshDevice, tokens: ttnn.Tensor, positions: ttnn.Tensor
) -> ttnn.MeshTraceId:
    """Trace: positions += 1 (skipping -1) and tokens copied into a persistent output."""
    ttnn.plus_one(positions, skip_negative_entries=True)  # compile before capture
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    ttnn.plus_one(positions, skip_negative_entries=True)
    ttnn.end_trace_capture(device, trace, cq_id=0)
    return trace


def test_capture_records_without_running_and_replay_runs_at_the_same_addresses(
    device: EmulatedMeshDevice,
) -> None:
    positions = on_device(device, [3, -1], ttnn.int32)
    trace = _capture_step(device, positions, positions)
    ttnn.synchronize_device(device)
    assert values_of(ttnn.from_device(positions)) == [4, -1]  # the capture ran nothing
    for _ in range(3):
        ttnn.execute_trace(device, trace, cq_id=0, blocking=False)
    assert device.pending(0) == 3
    assert values_of(ttnn.from_device(positions)) == [7, -1]
    ttnn.release_trace(device, trace)


def test_replay_reads_the_persistent_input_written_before_it(device: EmulatedMeshDevice) -> None:
    inp, out = on_device(device, [0, 0]), on_device(device, [0, 0])
    ttnn.copy(inp, out)
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    ttnn.copy(inp, out)
    ttnn.end_trace_capture(device, trace, cq_id=0)
    for step in range(3):
        ttnn.copy_host_to_device_tensor(host_ids([step, step + 10]), inp, cq_id=0)
        ttnn.execute_trace(device, trace, cq_id=0, blocking=True)
        assert values_of(ttnn.from_device(out)) == [step, step + 10]
    ttnn.release_trace(device, trace)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d, t: ttnn.copy_host_to_device_tensor(host_ids([1]), t, cq_id=0),
            "Writes are not supported during trace capture",
        ),
        (lambda d, t: t.cpu(blocking=False), "Reads are not supported during trace capture"),
        (lambda d, t: ttnn.from_device(t), "Reads are not supported during trace capture"),
        (
            lambda d, t: ttnn.event_synchronize(d.last_event),
            "Event Synchronization is not supported during trace capture",
        ),
        (
            lambda d, t: ttnn.record_event(d, 0),
            "Event Synchronization is not supported during trace capture",
        ),
    ],
)
def test_host_io_and_event_sync_during_capture_raise_with_tt_metal_wording(
    device: EmulatedMeshDevice, call: object, message: str
) -> None:
    t = on_device(device, [1])
    device.last_event = ttnn.record_event(device, 0)  # type: ignore[attr-defined]
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    with pytest.raises(RuntimeError, match=message):
        call(device, t)  # type: ignore[operator]
    ttnn.end_trace_capture(device, trace, cq_id=0)
    # The twin: the same call outside the capture is fine.
    ttnn.release_trace(device, trace)
    ttnn.copy_host_to_device_tensor(host_ids([1]), t, cq_id=0)
    ttnn.event_synchronize(ttnn.record_event(device, 0))


def test_the_other_queue_may_write_while_cq0_captures(device: EmulatedMeshDevice) -> None:
    t = on_device(device, [1])
    ttnn.synchronize_device(device)
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    ttnn.copy_host_to_device_tensor(host_ids([5]), t, cq_id=1)
    ttnn.end_trace_capture(device, trace, cq_id=0)
    assert values_of(ttnn.from_device(t, queue_id=1)) == [5]


def test_an_op_not_compiled_before_capture_cannot_be_captured(device: EmulatedMeshDevice) -> None:
    t = on_device(device, [1, 2])
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    with pytest.raises(RuntimeError, match="not in the program cache"):
        ttnn.plus_one(t)
    ttnn.end_trace_capture(device, trace, cq_id=0)
    ttnn.plus_one(t)  # the twin: compiled now, so a new capture accepts it
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    ttnn.plus_one(t)
    ttnn.end_trace_capture(device, trace, cq_id=0)
    ttnn.release_trace(device, trace)


def test_freeing_a_buffer_an_alive_trace_uses_is_reported(device: EmulatedMeshDevice) -> None:
    t = on_device(device, [1, 2], ttnn.int32)
    _capture_step(device, t, t)
    with pytest.raises(HazardError, match="trace-buffer-freed"):
        ttnn.deallocate(t)


def test_freeing_it_after_release_trace_is_fine(device: EmulatedMeshDevice) -> None:
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    ttnn.execute_trace(device, trace, cq_id=0, blocking=True)
    ttnn.release_trace(device, trace)
    ttnn.deallocate(t)
    assert device.hazards.total == 0


def test_dropping_the_last_reference_of_a_trace_buffer_is_reported_too(
    device: EmulatedMeshDevice,
) -> None:
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    del t  # the destructor frees the last reference
    assert device.hazards.counts[HazardKind.TRACE_BUFFER_FREED] == 1
    with pytest.raises(HazardError, match="trace-buffer-freed"):
        ttnn.execute_trace(device, trace, cq_id=0, blocking=False)


def test_replay_after_the_free_writes_over_the_new_owner(device: EmulatedMeshDevice) -> None:
    device.hazards.mode = "count"
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    ttnn.synchronize_device(device)
    ttnn.deallocate(t)
    newcomer = on_device(device, [100, 200], ttnn.int32)
    assert newcomer.buffer_address() == t.buffer_address()
    ttnn.execute_trace(device, trace, cq_id=0, blocking=True)
    assert values_of(ttnn.from_device(newcomer)) == [101, 201]  # clobbered by the replay
    assert device.hazards.counts[HazardKind.TRACE_BUFFER_FREED] == 1
    assert device.hazards.counts[HazardKind.TRACE_UNSAFE_ALLOCATION] == 1


def test_allocation_after_capture_alive_at_replay_is_reported(device: EmulatedMeshDevice) -> None:
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    late = on_device(device, [9, 9])
    with pytest.raises(HazardError, match="trace-unsafe-allocation") as caught:
        ttnn.execute_trace(device, trace, cq_id=0, blocking=False)
    assert caught.value.hazard.buffers == (late.buffer.label,)
    ttnn.release_trace(device, trace)


def test_allocation_before_capture_or_freed_before_replay_is_fine(
    device: EmulatedMeshDevice,
) -> None:
    early = on_device(device, [9, 9])
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    late = on_device(device, [9, 9])
    ttnn.deallocate(late)
    ttnn.execute_trace(device, trace, cq_id=0, blocking=True)
    assert early.is_allocated() and device.hazards.total == 0
    ttnn.release_trace(device, trace)


def test_capture_needs_a_trace_region() -> None:
    device = open_emulated(trace_region_size=0)
    t = on_device(device, [1], ttnn.int32)
    ttnn.plus_one(t)
    trace = ttnn.begin_trace_capture(device, cq_id=0)
    ttnn.plus_one(t)
    with pytest.raises(RuntimeError, match="allocated for trace region"):
        ttnn.end_trace_capture(device, trace, cq_id=0)
    ttnn.close_mesh_device(device)

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
    tt = device.api
    tt.plus_one(positions, skip_negative_entries=True)  # compile before capture
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.plus_one(positions, skip_negative_entries=True)
    tt.end_trace_capture(device, trace, cq_id=0)
    return trace


def test_capture_records_without_running_and_replay_runs_at_the_same_addresses(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    positions = on_device(device, [3, -1], ttnn.int32)
    trace = _capture_step(device, positions, positions)
    tt.synchronize_device(device)
    assert values_of(tt.from_device(positions)) == [4, -1]  # the capture ran nothing
    for _ in range(3):
        tt.execute_trace(device, trace, cq_id=0, blocking=False)
    assert device.pending(0) == 3
    assert values_of(tt.from_device(positions)) == [7, -1]
    tt.release_trace(device, trace)


def test_replay_reads_the_persistent_input_written_before_it(device: EmulatedMeshDevice) -> None:
    tt = device.api
    inp, out = on_device(device, [0, 0]), on_device(device, [0, 0])
    tt.copy(inp, out)
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.copy(inp, out)
    tt.end_trace_capture(device, trace, cq_id=0)
    for step in range(3):
        tt.copy_host_to_device_tensor(host_ids([step, step + 10]), inp, cq_id=0)
        tt.execute_trace(device, trace, cq_id=0, blocking=True)
        assert values_of(tt.from_device(out)) == [step, step + 10]
    tt.release_trace(device, trace)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d, t: d.api.copy_host_to_device_tensor(host_ids([1]), t, cq_id=0),
            "Writes are not supported during trace capture",
        ),
        (lambda d, t: t.cpu(blocking=False), "Reads are not supported during trace capture"),
        (lambda d, t: d.api.from_device(t), "Reads are not supported during trace capture"),
        (
            lambda d, t: d.api.event_synchronize(d.last_event),
            "Event Synchronization is not supported during trace capture",
        ),
        (
            lambda d, t: d.api.record_event(d, 0),
            "Event Synchronization is not supported during trace capture",
        ),
    ],
)
def test_host_io_and_event_sync_during_capture_raise_with_tt_metal_wording(
    device: EmulatedMeshDevice, call: object, message: str
) -> None:
    tt = device.api
    t = on_device(device, [1])
    device.last_event = tt.record_event(device, 0)  # type: ignore[attr-defined]
    trace = tt.begin_trace_capture(device, cq_id=0)
    with pytest.raises(RuntimeError, match=message):
        call(device, t)  # type: ignore[operator]
    tt.end_trace_capture(device, trace, cq_id=0)
    # The twin: the same call outside the capture is fine.
    tt.release_trace(device, trace)
    tt.copy_host_to_device_tensor(host_ids([1]), t, cq_id=0)
    tt.event_synchronize(tt.record_event(device, 0))


def test_the_other_queue_may_write_while_cq0_captures(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1])
    tt.synchronize_device(device)
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.copy_host_to_device_tensor(host_ids([5]), t, cq_id=1)
    tt.end_trace_capture(device, trace, cq_id=0)
    assert values_of(tt.from_device(t, queue_id=1)) == [5]


def test_an_op_not_compiled_before_capture_cannot_be_captured(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2])
    trace = tt.begin_trace_capture(device, cq_id=0)
    with pytest.raises(RuntimeError, match="not in the program cache"):
        tt.plus_one(t)
    tt.end_trace_capture(device, trace, cq_id=0)
    tt.plus_one(t)  # the twin: compiled now, so a new capture accepts it
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.plus_one(t)
    tt.end_trace_capture(device, trace, cq_id=0)
    tt.release_trace(device, trace)


def test_freeing_a_buffer_an_alive_trace_uses_is_reported(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2], ttnn.int32)
    _capture_step(device, t, t)
    with pytest.raises(HazardError, match="trace-buffer-freed"):
        tt.deallocate(t)


def test_freeing_it_after_release_trace_is_fine(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    tt.execute_trace(device, trace, cq_id=0, blocking=True)
    tt.release_trace(device, trace)
    tt.deallocate(t)
    assert device.hazards.total == 0


def test_dropping_the_last_reference_of_a_trace_buffer_is_reported_too(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    del t  # the destructor frees the last reference
    assert device.hazards.counts[HazardKind.TRACE_BUFFER_FREED] == 1
    with pytest.raises(HazardError, match="trace-buffer-freed"):
        tt.execute_trace(device, trace, cq_id=0, blocking=False)


def test_replay_after_the_free_writes_over_the_new_owner(device: EmulatedMeshDevice) -> None:
    tt = device.api
    device.hazards.mode = "count"
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    tt.synchronize_device(device)
    tt.deallocate(t)
    newcomer = on_device(device, [100, 200], ttnn.int32)
    assert newcomer.buffer_address() == t.buffer_address()
    tt.execute_trace(device, trace, cq_id=0, blocking=True)
    assert values_of(tt.from_device(newcomer)) == [101, 201]  # clobbered by the replay
    assert device.hazards.counts[HazardKind.TRACE_BUFFER_FREED] == 1
    assert device.hazards.counts[HazardKind.TRACE_UNSAFE_ALLOCATION] == 1


def test_allocation_after_capture_alive_at_replay_is_reported(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    late = on_device(device, [9, 9])
    with pytest.raises(HazardError, match="trace-unsafe-allocation") as caught:
        tt.execute_trace(device, trace, cq_id=0, blocking=False)
    assert caught.value.hazard.buffers == (late.buffer.label,)
    tt.release_trace(device, trace)


def test_allocation_before_capture_or_freed_before_replay_is_fine(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    early = on_device(device, [9, 9])
    t = on_device(device, [1, 2], ttnn.int32)
    trace = _capture_step(device, t, t)
    late = on_device(device, [9, 9])
    tt.deallocate(late)
    tt.execute_trace(device, trace, cq_id=0, blocking=True)
    assert early.is_allocated() and device.hazards.total == 0
    tt.release_trace(device, trace)


def test_capture_needs_a_trace_region() -> None:
    device = open_emulated(trace_region_size=0)
    tt = device.api
    t = on_device(device, [1], ttnn.int32)
    tt.plus_one(t)
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.plus_one(t)
    with pytest.raises(RuntimeError, match="allocated for trace region"):
        tt.end_trace_capture(device, trace, cq_id=0)
    tt.close_mesh_device(device)

"""The canonical two-queue handshake (ttnn-runtime.md): inputs written on CQ1, compute on CQ0,
readback on CQ1. It runs clean for 1,000 iterations; without any one of its waits, a hazard."""

from __future__ import annotations

import gc

import pytest
import torch
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, HazardError, HazardKind, MeshEvent

WAITS = ("op_event", "write_event", "last_op_event", "read_event")


def run_handshake(
    device: EmulatedMeshDevice, iterations: int, *, skip: str | None = None
) -> list[int]:
    """The tt-metal 2-CQ trace loop: CQ1 writes input i + 1 while CQ0 runs step i, then reads
    step i's output. Step i's output is input i + 1; the host checks it one step later (depth 2).
    Returns output - input per step (1 when every step read the right data)."""
    return Handshake(device, skip).run(iterations)


class Handshake:
    """The loop's persistent tensors, its captured model (work += 1) and its four events."""

    ROWS = 4

    def __init__(self, device: EmulatedMeshDevice, skip: str | None) -> None:
        self.tt = tt = device.api
        self.device, self.skip = device, skip
        self.inp, self.work, self.out = (
            tt.allocate_tensor_on_device(
                ttnn.Shape([1, self.ROWS]), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT, device
            )
            for _ in range(3)
        )
        # Compile every op, then capture the model against the persistent `work`.
        tt.copy(self.inp, self.work)
        tt.plus_one(self.work)
        tt.copy(self.work, self.out)
        self.trace = tt.begin_trace_capture(device, cq_id=0)
        tt.plus_one(self.work)
        tt.end_trace_capture(device, self.trace, cq_id=0)
        first_op_event = tt.record_event(device, 0)
        self.read_event = tt.record_event(device, 1)
        tt.wait_for_event(1, first_op_event)
        tt.copy_host_to_device_tensor(self.host_input(0), self.inp, cq_id=1)
        self.write_event = tt.record_event(device, 1)

    def host_input(self, value: int) -> ttnn.Tensor:
        return ttnn.from_torch(
            torch.full((1, self.ROWS), value, dtype=torch.int32), dtype=ttnn.int32
        )

    def wait(self, name: str, cq: int, event: object) -> None:
        if self.skip != name:
            self.tt.wait_for_event(cq, event)

    def iteration(self, i: int) -> ttnn.Tensor:
        """Step i on both queues; returns output i's non-blocking readback."""
        device = self.device
        # CQ0: consume input i, run the model, write the output once CQ1 has read the last one.
        self.wait("write_event", 0, self.write_event)
        self.tt.copy(self.inp, self.work)
        first_op_event = self.tt.record_event(device, 0)
        self.tt.execute_trace(device, self.trace, cq_id=0, blocking=False)
        self.wait("read_event", 0, self.read_event)
        self.tt.copy(self.work, self.out)
        last_op_event = self.tt.record_event(device, 0)
        # CQ1: write input i + 1 once CQ0 has consumed input i, then read output i.
        self.wait("op_event", 1, first_op_event)
        self.tt.copy_host_to_device_tensor(self.host_input(i + 1), self.inp, cq_id=1)
        self.write_event = self.tt.record_event(device, 1)
        self.wait("last_op_event", 1, last_op_event)
        readback = self.out.cpu(blocking=False, cq_id=1)
        self.read_event = self.tt.record_event(device, 1)
        return readback

    def run(self, iterations: int) -> list[int]:
        in_flight: list[tuple[int, ttnn.Tensor, object]] = []
        seen: list[int] = []
        for i in range(iterations):
            in_flight.append((i, self.iteration(i), self.read_event))
            if len(in_flight) == 2:  # depth 2: only now wait for the previous step
                seen.append(_checked(*in_flight.pop(0)))
        seen.extend(_checked(*entry) for entry in in_flight)
        self.tt.synchronize_device(self.device)
        self.tt.release_trace(self.device, self.trace)
        return seen


def _checked(step: int, readback: ttnn.Tensor, event: MeshEvent) -> int:
    tt = event.device.api
    tt.event_synchronize(event)
    return int(tt.to_torch(readback)[0, 0]) - step


def test_handshake_runs_1000_iterations_without_hazard(device: EmulatedMeshDevice) -> None:
    seen = run_handshake(device, 1000)
    assert seen == [1] * 1000  # every step's output is its own input + 1
    assert device.hazards.total == 0
    assert len(device.completion_log) > 8 * 1000


EXPECTED = {
    "op_event": HazardKind.WRITE_AFTER_READ,  # input i + 1 written while the first op reads input i
    "write_event": HazardKind.READ_AFTER_WRITE,  # the first op reads the input being written
    "read_event": HazardKind.WRITE_AFTER_READ,  # the output overwritten while CQ1 reads it
    "last_op_event": HazardKind.READ_AFTER_WRITE,  # CQ1 reads the output being written
}


@pytest.mark.parametrize("skip", WAITS)
def test_removing_any_wait_is_a_hazard(device: EmulatedMeshDevice, skip: str) -> None:
    device.hazards.mode = "count"
    run_handshake(device, 6, skip=skip)
    assert device.hazards.counts[EXPECTED[skip]] > 0, device.hazards.counts
    assert set(device.hazards.counts) == {EXPECTED[skip]}


@pytest.mark.parametrize("skip", WAITS)
def test_a_removed_wait_raises_in_raise_mode(device: EmulatedMeshDevice, skip: str) -> None:
    with pytest.raises(HazardError) as caught:
        run_handshake(device, 6, skip=skip)
    assert caught.value.hazard.kind == EXPECTED[skip]
    # Abandoning the pipeline mid-flight drops its readbacks and trace buffers: more hazards,
    # found while unwinding; they are not what this test is about.
    del caught
    gc.collect()
    device.hazards.take_deferred()

"""Trace mode and the two-queue readback, each with the twin that shows its check is live."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, HazardError, HazardKind
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.tt_backend import TtBackend, TtMirror
from ttmirror.serving.engine import Engine, EngineConfig


def engine_with(tt: TtBackend, *, trace: bool, requests: int = 4) -> Engine:
    engine = Engine(tt, EngineConfig(async_scheduling="on", rows=4, trace=trace))
    for req in range(requests):
        engine.submit(req, prompt=req, max_tokens=12)
    return engine


def mirror_of(engine: Engine) -> TtMirror:
    mirror = engine.runner.mirror
    assert isinstance(mirror, TtMirror)
    return mirror


def test_the_decode_step_is_captured_once_per_slot_and_replayed_for_every_step(
    tt: TtBackend, device: EmulatedMeshDevice
) -> None:
    engine = engine_with(tt, trace=True)
    mirror = mirror_of(engine)
    addresses = list(mirror.ring.addresses)
    serial = device.allocator.next_serial
    engine.run()
    reference = ProbeReference(ProbeSpec())
    assert all(engine.delivered(r) == reference.sequence(r, 12) for r in range(4))
    described = mirror.describe()
    assert described["trace_captures"] == 2
    assert described["trace_replays"] == described["launches"] == 12
    assert device.allocator.next_serial == serial  # nothing allocated after capture
    assert [slot.buffer_address() for slot in mirror.ring.slots] == addresses
    mirror.ring.check()
    with pytest.raises(RuntimeError, match="release the decode traces"):
        mirror.ring.release()  # the ring outlives the traces that replay into it
    assert device.hazards.total == 0
    engine.close()


def test_twin_an_allocation_after_capture_is_reported_at_the_next_replay(
    tt: TtBackend, device: EmulatedMeshDevice
) -> None:
    api = device.api
    engine = engine_with(tt, trace=True)
    engine.step()
    stray = api.allocate_tensor_on_device(
        ttnn.Shape([1, 32]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    with pytest.raises(HazardError, match="trace-unsafe-allocation"):
        engine.step()
    engine.close()  # synchronise and release the traces before their buffers can go
    api.deallocate(stray)


def test_readback_runs_on_cq1_ordered_by_events(tt: TtBackend, device: EmulatedMeshDevice) -> None:
    engine = engine_with(tt, trace=False)
    engine.run()
    engine.close()
    assert mirror_of(engine).readback_cq == 1
    assert device.hazards.total == 0


def _dropping_waits(device: EmulatedMeshDevice, on_cq: int) -> Callable[..., Any]:
    wait = device.api.wait_for_event

    def maybe_wait(cq_id: int, mesh_event: Any) -> None:
        if cq_id != on_cq:
            wait(cq_id, mesh_event)

    return maybe_wait


def test_twin_without_the_cq1_wait_the_readback_races_the_sampler(
    tt: TtBackend, device: EmulatedMeshDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The twin's bug in the API the mirror was handed (ttnn itself is never patched).
    monkeypatch.setattr(device.api, "wait_for_event", _dropping_waits(device, on_cq=1))
    engine = engine_with(tt, trace=False)
    with pytest.raises(HazardError) as error:
        engine.run()
    engine.close()
    assert error.value.hazard.kind == HazardKind.READ_AFTER_WRITE
    assert any("argmax" in c for c in error.value.hazard.commands)

"""A real run on a device opened with the allocator's planted bug: the runner saved, then two
copies restored and stepped together, as a saved-state walk does. With "spare-handed-out-twice"
the copies share DRAM and the overlap check fails the run; without it the same run passes."""

from __future__ import annotations

from typing import Any

import pytest
import ttnn

from ttmirror.conformance import allocator_runs
from ttmirror.conformance.allocator_runs import delivered, device_of, step
from ttmirror.emulator import (
    EmulatedMeshDevice,
    Emulator,
    HazardError,
    HazardKind,
    ManualScheduler,
    open_device,
)
from ttmirror.emulator import allocator as allocator_module
from ttmirror.emulator.allocator import SPARE_HANDED_OUT_TWICE
from ttmirror.emulator.snapshot import restore, snapshot
from ttmirror.impl.runner import Runner, RunnerConfig
from ttmirror.impl.tt_backend import TtBackend

DRAM = allocator_runs.DRAM


@pytest.mark.parametrize("planted", [frozenset(), frozenset({SPARE_HANDED_OUT_TWICE})],
                         ids=["unplanted", "planted"])
def test_restored_copies_stepped_together_share_no_dram_unless_planted(
        planted: frozenset[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A spare list of this test's own: the planted run leaves its shared DRAM listed.
    monkeypatch.setattr(allocator_module, "_SPARE", [])
    device = open_device(
        num_command_queues=2, trace_region_size=1 << 20, emulated=True,
        emulator=Emulator(scheduler=ManualScheduler, dram_size=DRAM, planted=planted),
    )
    assert isinstance(device, EmulatedMeshDevice) and device.allocator.planted == planted
    runner = Runner(TtBackend(device, readback_cq=1),
                    RunnerConfig(depth=2, slots=2, rows=2, max_tokens=6))
    copies: list[Any] = []
    try:
        runner.allocate()
        runner.arrive(0, 5, max_tokens=6)
        runner.arrive(1, 9, max_tokens=6)
        step(runner)
        saved = snapshot(runner)
        discarded = restore(saved)  # discarded at once: its DRAM is the spare the next one takes
        device_of(discarded).discard()
        copies += [restore(saved), restore(saved)]
        if planted:
            with pytest.raises(HazardError, match="overlapping-allocation") as caught:
                for copy in copies:
                    step(copy)
            assert caught.value.hazard.kind == HazardKind.OVERLAPPING_ALLOCATION
            assert "of another live allocator on this DRAM" in caught.value.hazard.buffers[1]
        else:
            for _ in range(3):
                for run in (runner, *copies):
                    step(run)
            assert delivered(copies[0]) == delivered(copies[1]) == delivered(runner)
            assert all(len(tokens) == 4 for tokens in delivered(runner))
            assert all(device_of(run).hazards.total == 0 for run in (runner, *copies))
    finally:
        for copy in copies:
            device_of(copy).discard()
        ttnn.close_mesh_device(device)


def test_the_allocator_half_kills_the_planted_spare_and_passes_without_it() -> None:
    """`ttmirror mutants` lists the allocator's planted bug: the same scenario, as a kill."""
    assert allocator_runs.check().layer is None
    killed, verdict = allocator_runs.kill(SPARE_HANDED_OUT_TWICE)
    assert killed and verdict.layer == "hazard"
    assert verdict.message is not None and "overlapping-allocation" in verdict.message

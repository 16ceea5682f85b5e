"""Fixtures: an emulated device from the entry point (forced, so these tests also run beside a
chip), hazards raised at the call that makes them, completion order drawn from a seed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ttmirror.emulator import EmulatedMeshDevice, Emulator, SeededScheduler, open_device
from ttmirror.impl.tt_backend import TtBackend

DRAM = 4 << 20
TRACE_REGION = 1 << 20


@pytest.fixture
def device() -> Iterator[EmulatedMeshDevice]:
    dev = open_device(
        num_command_queues=2,
        trace_region_size=TRACE_REGION,
        emulator=Emulator(
            scheduler=lambda: SeededScheduler(seed=7), hazard_mode="raise", dram_size=DRAM
        ),
        emulated=True,
    )
    tt = dev.api
    assert isinstance(dev, EmulatedMeshDevice)
    yield dev
    tt.close_mesh_device(dev)


@pytest.fixture
def tt(device: EmulatedMeshDevice) -> TtBackend:
    return TtBackend(device)

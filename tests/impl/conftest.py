"""Fixtures: ttnn routed to the emulated device (forced, so these tests also run beside a chip),
hazards raised at the call that makes them, completion order drawn from a seed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ttnn

from ttmirror.impl.device import EmulatedMeshDevice, SeededScheduler, routing
from ttmirror.impl.tt_backend import TtBackend

DRAM = 4 << 20
TRACE_REGION = 1 << 20


@pytest.fixture
def routed() -> Iterator[None]:
    with routing.emulation(
        force=True, dram_size=DRAM, hazard_mode="raise", scheduler=lambda: SeededScheduler(seed=7)
    ):
        yield


@pytest.fixture
def device(routed: None) -> Iterator[EmulatedMeshDevice]:
    dev = ttnn.open_mesh_device(
        ttnn.MeshShape(1, 1), num_command_queues=2, trace_region_size=TRACE_REGION
    )
    assert isinstance(dev, EmulatedMeshDevice)
    yield dev
    ttnn.close_mesh_device(dev)


@pytest.fixture
def tt(device: EmulatedMeshDevice) -> TtBackend:
    return TtBackend(device)

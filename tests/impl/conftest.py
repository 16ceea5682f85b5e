"""Fixtures: an emulated device from the entry point (forced, so these tests also run beside a
chip), hazards raised at the call that makes them, completion order drawn from a seed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ttmirror.conformance.rig import open_rig
from ttmirror.emulator import EmulatedMeshDevice, SeededScheduler
from ttmirror.impl.tt_backend import TtBackend


@pytest.fixture
def device() -> Iterator[EmulatedMeshDevice]:
    dev = open_rig("mirror", scheduler=lambda: SeededScheduler(seed=7))
    assert isinstance(dev, EmulatedMeshDevice)
    yield dev
    dev.api.close_mesh_device(dev)


@pytest.fixture
def tt(device: EmulatedMeshDevice) -> TtBackend:
    return TtBackend(device)

"""Fixtures: emulated devices from the entry point (forced: these tests also run beside a chip)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import ttnn

from ttmirror.conformance.rig import open_rig
from ttmirror.emulator import EmulatedMeshDevice
from ttmirror.emulator.device import Scheduler
from ttmirror.emulator.hazards import HazardMode
from ttmirror.emulator.schedulers import ManualScheduler


def open_emulated(
    *,
    trace_region_size: int = 1 << 20,
    scheduler: Callable[[], Scheduler] = ManualScheduler,
    hazard_mode: HazardMode = "raise",
    process: bool = False,
) -> EmulatedMeshDevice:
    """An emulated device with two CQs, opened through the one entry point (`process`: its
    queues in a device process, completed as `scheduler` says)."""
    dev = open_rig("tiny", scheduler=scheduler, hazard_mode=hazard_mode, process=process,
                   trace_region=trace_region_size)
    assert isinstance(dev, EmulatedMeshDevice)
    return dev


@pytest.fixture
def device() -> Iterator[EmulatedMeshDevice]:
    dev = open_emulated()
    tt = dev.api
    yield dev
    tt.close_mesh_device(dev)


def host_ids(values: list[int], dtype: ttnn.DataType = ttnn.uint32) -> ttnn.Tensor:
    """A real ttnn host tensor [1, n] of token ids."""
    return ttnn.from_torch(
        torch.tensor(values, dtype=torch.int32).reshape(1, -1),
        dtype=dtype,
        layout=ttnn.ROW_MAJOR_LAYOUT,
    )


def values_of(host: ttnn.Tensor, tt: Any = ttnn) -> list[int]:
    """A host tensor's values, read through `tt` (a device's API object sees a read of a
    tensor its non-blocking readback still fills)."""
    return [int(v) for v in tt.to_torch(host).reshape(-1).tolist()]


def on_device(
    dev: EmulatedMeshDevice, values: list[int], dtype: ttnn.DataType = ttnn.uint32
) -> ttnn.Tensor:
    tt = dev.api
    return tt.from_torch(
        torch.tensor(values, dtype=torch.int32).reshape(1, -1),
        dtype=dtype,
        layout=ttnn.ROW_MAJOR_LAYOUT,
        device=dev,
    )

"""Fixtures: ttnn routed to the emulated device (forced, so these tests also run beside a chip)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import ttnn

from ttmirror.impl.device import EmulatedMeshDevice, routing

DRAM = 1 << 20  # small DRAM keeps device creation cheap


@pytest.fixture
def routed() -> Iterator[None]:
    with routing.emulation(force=True, dram_size=DRAM):
        yield


@pytest.fixture
def device(routed: None) -> Iterator[EmulatedMeshDevice]:
    dev = ttnn.open_mesh_device(
        mesh_shape=ttnn.MeshShape(1, 1), num_command_queues=2, trace_region_size=1 << 20
    )
    assert isinstance(dev, EmulatedMeshDevice)
    yield dev
    ttnn.close_mesh_device(dev)


def host_ids(values: list[int], dtype: ttnn.DataType = ttnn.uint32) -> ttnn.Tensor:
    """A real ttnn host tensor [1, n] of token ids."""
    return ttnn.from_torch(
        torch.tensor(values, dtype=torch.int32).reshape(1, -1),
        dtype=dtype,
        layout=ttnn.ROW_MAJOR_LAYOUT,
    )


def values_of(host: ttnn.Tensor) -> list[int]:
    return [int(v) for v in ttnn.to_torch(host).reshape(-1).tolist()]


def on_device(
    dev: EmulatedMeshDevice, values: list[int], dtype: ttnn.DataType = ttnn.uint32
) -> ttnn.Tensor:
    return ttnn.from_torch(
        torch.tensor(values, dtype=torch.int32).reshape(1, -1),
        dtype=dtype,
        layout=ttnn.ROW_MAJOR_LAYOUT,
        device=dev,
    )

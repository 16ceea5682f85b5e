"""Tensors of the emulated device, and in-place access to real ttnn host tensors.

Host tensors are real `ttnn.Tensor` host tensors (ROW_MAJOR: a TILE host tensor needs a chip to
size its tiles). Device tensors are `DeviceTensor`, which quacks like a device `ttnn.Tensor` for
what the TT code uses; anything it does not emulate raises AttributeError rather than guessing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import ttnn

from .allocator import Buffer

if TYPE_CHECKING:
    from .device import EmulatedMeshDevice

TILE = 32
_COORD = ttnn.MeshCoordinate(0, 0)


_TORCH_DTYPES: dict[int, torch.dtype] = {}


def torch_dtype(dtype: ttnn.DataType) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype.value)
    if found is None:
        found = _TORCH_DTYPES[dtype.value] = ttnn.ttnn_dtype_to_torch_dtype(dtype)
    return found


@dataclass(frozen=True)
class Region:
    """Where a tensor's elements live in DRAM: what a captured command keeps instead of a tensor."""

    address: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def storage_bytes(shape: tuple[int, ...], dtype: ttnn.DataType, layout: ttnn.Layout) -> int:
    """Bytes a tensor occupies on the chip: TILE pads the last two dimensions to 32."""
    return math.prod(padded(shape, layout)) * torch_dtype(dtype).itemsize


def padded(shape: tuple[int, ...], layout: ttnn.Layout) -> list[int]:
    dims = list(shape) or [1]
    if layout == ttnn.TILE_LAYOUT:
        dims[-1] = -(-dims[-1] // TILE) * TILE
        if len(dims) > 1:
            dims[-2] = -(-dims[-2] // TILE) * TILE
    return dims


class DeviceTensor:
    """A tensor in the emulated device's DRAM. Elements are stored row-major from its address."""

    def __init__(
        self,
        device: EmulatedMeshDevice,
        buffer: Buffer,
        shape: tuple[int, ...],
        dtype: ttnn.DataType,
        layout: ttnn.Layout,
        memory_config: ttnn.MemoryConfig | None = None,
    ) -> None:
        self._device = device
        self._buffer = buffer
        self._shape = shape
        self._dtype = dtype
        self._layout = layout
        self._memory_config = memory_config or ttnn.DRAM_MEMORY_CONFIG
        self._released = False
        buffer.handles += 1
        element = torch_dtype(dtype)
        self.region = Region(buffer.address, math.prod(shape) * element.itemsize, element, shape)
        # What the program cache and output-shape cache key on: plain values hash fast.
        self.spec_key = (shape, dtype.value, layout.value)
        self._view: torch.Tensor | None = None
        self._flat: torch.Tensor | None = None

    # --- what a device ttnn.Tensor answers -------------------------------------------------------
    @property
    def shape(self) -> ttnn.Shape:
        return ttnn.Shape(list(self._shape))

    @property
    def logical_shape(self) -> ttnn.Shape:
        return self.shape

    @property
    def padded_shape(self) -> ttnn.Shape:
        return ttnn.Shape(padded(self._shape, self._layout))

    @property
    def dtype(self) -> ttnn.DataType:
        return self._dtype

    @property
    def layout(self) -> ttnn.Layout:
        return self._layout

    def get_dtype(self) -> ttnn.DataType:
        return self._dtype

    def get_layout(self) -> ttnn.Layout:
        return self._layout

    def storage_type(self) -> ttnn.StorageType:
        return ttnn.StorageType.DEVICE

    def device(self) -> EmulatedMeshDevice:
        return self._device

    def memory_config(self) -> ttnn.MemoryConfig:
        return self._memory_config

    def is_allocated(self) -> bool:
        return not self._released and self._buffer.allocated

    def buffer_address(self) -> int:
        return self._buffer.address

    def volume(self) -> int:
        return math.prod(self._shape)

    def element_size(self) -> int:
        return torch_dtype(self._dtype).itemsize

    def cpu(self, *args: Any, **kwargs: Any) -> ttnn.Tensor:
        return self._device.tensor_cpu(self, args, kwargs)

    def deallocate(self, *args: Any, **kwargs: Any) -> None:
        self._device.tensor_deallocate(self, args, kwargs)

    def to_torch(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("Tensor.to_torch: the tensor must be on host (call .cpu() first)")

    # --- emulator side ---------------------------------------------------------------------------
    @property
    def buffer(self) -> Buffer:
        return self._buffer

    @property
    def data(self) -> torch.Tensor:
        """A typed view of this tensor's DRAM bytes (DRAM never moves, so it stays valid)."""
        if self._view is None:
            self._view = self._device.view(self.region)
        return self._view

    @property
    def flat(self) -> torch.Tensor:
        """The same bytes as a 1-D typed view."""
        if self._flat is None:
            self._flat = self.data.reshape(-1)
        return self._flat

    def release_handle(self) -> bool:
        """Drop this handle's reference; True when it was the buffer's last one."""
        if self._released:
            return False
        self._released = True
        self._buffer.handles -= 1
        return self._buffer.handles == 0

    def __del__(self) -> None:
        # The destructor frees only the last reference, as ttnn's reference-counted tensors do.
        try:
            if not self._released and self.release_handle() and self._buffer.allocated:
                self._device.free_on_last_reference(self._buffer)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "" if self.is_allocated() else ", deallocated"
        return (
            f"ttnn.Tensor(<emulated device tensor {self._buffer.label}>, shape={self.shape}, "
            f"dtype={self._dtype}, layout={self._layout}{state})"
        )


class HostReadback(ttnn.Tensor):
    """The real host tensor a non-blocking readback returns; weak-referenceable (a plain
    ttnn.Tensor is not), so the device can tell when the host drops it before synchronising."""


def host_bytes(tensor: ttnn.Tensor) -> torch.Tensor:
    """A writable uint8 view of a ROW_MAJOR host tensor's storage (shared through DLPack)."""
    shard = tensor.host_buffer().get_shard(_COORD)
    return torch.from_dlpack(shard)


def new_host_tensor(
    shape: tuple[int, ...], dtype: ttnn.DataType, cls: type = ttnn.Tensor
) -> ttnn.Tensor:
    """A ROW_MAJOR host tensor of the given spec, zero-filled."""
    return cls(torch.zeros(shape, dtype=torch_dtype(dtype)), dtype)


def as_shape(shape: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)

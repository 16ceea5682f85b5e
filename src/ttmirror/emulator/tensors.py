"""Tensors of the emulated device, and in-place access to real ttnn host tensors.

Host tensors are real `ttnn.Tensor` host tensors (ROW_MAJOR: a TILE host tensor needs a chip to
size its tiles). Device tensors are `DeviceTensor`, which quacks like a device `ttnn.Tensor` for
what the TT code uses; anything it does not emulate raises AttributeError rather than guessing.

Storage follows the chip's sizes. A ROW_MAJOR tensor holds its logical shape. A TILE tensor holds
its padded shape (the last two dimensions rounded up to 32x32 tiles), stored row-major over the
padded shape rather than tile by tile: only ops and transfers see the bytes, and both go through
the logical view (`data`), so the order inside a tile is never observable. The padding holds
whatever the op that wrote the tensor left there: undefined, as on a chip, except after a layout
conversion that pads with its `pad_value`.
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


@dataclass(frozen=True)
class Operand:
    """A tensor's elements in DRAM, by value: where they are stored, and the shape read there
    (the logical shape; for a TILE tensor's padding included, its stored shape)."""

    region: Region
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"[0x{self.region.address:x} {list(self.shape)} {self.region.dtype}]"


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
        stored = tuple(padded(shape, layout)) if layout == ttnn.TILE_LAYOUT else shape
        self.region = Region(buffer.address, math.prod(stored) * element.itemsize, element, stored)
        """The stored elements: the padded shape for TILE."""
        # What the program cache and output-shape cache key on: plain values hash fast.
        self.spec_key = (shape, dtype.value, layout.value)
        self.dims = shape
        """The logical shape as plain ints (cheap: `shape` builds a ttnn.Shape)."""
        self.spec_names = (dtype.name, layout.name)
        """(dtype, layout) by name, as the support table spells them."""
        self.interleaved = not self._memory_config.is_sharded()
        self._view: torch.Tensor | None = None

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
    def stored(self) -> torch.Tensor:
        """A typed view of every stored element, padding included (DRAM never moves)."""
        return region_view(self._device.allocator.memory, self.stored_operand)

    @property
    def data(self) -> torch.Tensor:
        """A typed view of the logical elements (for TILE, the padded storage less its padding)."""
        if self._view is None:
            self._view = region_view(self._device.allocator.memory, self.operand)
        return self._view

    @property
    def operand(self) -> Operand:
        """Its logical elements in DRAM, as a command holds them (data, not a view)."""
        return Operand(self.region, self.dims)

    @property
    def stored_operand(self) -> Operand:
        """Every stored element, padding included, as a command holds them."""
        return Operand(self.region, self.region.shape)

    @property
    def tiled(self) -> bool:
        return self._layout == ttnn.TILE_LAYOUT

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_view"] = None  # a cached view of DRAM: a copy makes its own, of its own DRAM
        return state

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


def host_operand(host: ttnn.Tensor, operand: Operand) -> torch.Tensor:
    """A writable typed view of a ROW_MAJOR host tensor's elements, shaped as `operand`."""
    element = operand.region.dtype
    nbytes = math.prod(operand.shape) * element.itemsize
    return host_bytes(host)[:nbytes].view(element).reshape(operand.shape)


def region_view(memory: torch.Tensor, operand: Operand) -> torch.Tensor:
    """A typed view of `operand`'s elements in the DRAM bytes `memory` (no copy)."""
    region = operand.region
    stored = memory[region.address : region.address + region.nbytes].view(region.dtype)
    stored = stored.view(region.shape)
    if operand.shape != region.shape:
        stored = stored[tuple(slice(0, d) for d in operand.shape)]
    return stored


def new_host_tensor(
    shape: tuple[int, ...], dtype: ttnn.DataType, cls: type = ttnn.Tensor
) -> ttnn.Tensor:
    """A ROW_MAJOR host tensor of the given spec, zero-filled."""
    return cls(torch.zeros(shape, dtype=torch_dtype(dtype)), dtype)


def as_shape(shape: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


VIEWS_KEPT = 4096
"""Distinct operands whose DRAM views a device keeps (a step reads a few dozen)."""


def kept_view(views: dict[Operand, torch.Tensor], memory: torch.Tensor,
              operand: Operand) -> torch.Tensor:
    """`operand`'s elements in `memory`, a view kept in `views`: the same few regions are read
    every step, and building a typed view costs more than most kernels on it."""
    found = views.get(operand)
    if found is None:
        if len(views) >= VIEWS_KEPT:
            views.clear()
        found = views[operand] = region_view(memory, operand)
    return found

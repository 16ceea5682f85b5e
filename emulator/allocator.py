"""DRAM of the emulated device: a first-fit allocator over a finite region, and its contents.

Like tt-metal's allocator, the books are kept on the host only and never wait for command queues:
a freed address is reusable at once, bottom-up, so a stale reader of a freed buffer reads
whatever was allocated there next. The bytes live in one backing tensor that persists across
frees, so a use-after-free or an early reuse yields real wrong data, as on the chip.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ALIGNMENT = 32  # DRAM buffers start on 32-byte boundaries (also keeps typed views aligned)
FILL_BYTE = 0xA5  # never-written DRAM reads as 0xA5A5…, visibly not a token id


_SPARES = 4
_SPARE: list[tuple[torch.Tensor, int]] = []
"""DRAM of discarded copies, and each one's high-water mark, for restored copies to reuse."""


def _take_spare(size: int) -> tuple[torch.Tensor, int] | None:
    for i, (memory, _) in enumerate(_SPARE):
        if memory.numel() == size:
            return _SPARE.pop(i)
    return None


@dataclass(eq=False)
class Buffer:
    """One allocation. `history` and `traces` belong to the hazard and trace bookkeeping."""

    serial: int
    address: int
    size: int
    allocated: bool = True
    handles: int = 0  # DeviceTensor objects sharing this buffer (the reference count)
    traces: set[int] = field(default_factory=set)  # alive traces whose commands use it
    history: Any = None

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def label(self) -> str:
        state = "" if self.allocated else " freed"
        return f"buffer#{self.serial}@0x{self.address:x}+{self.size}{state}"

    def overlaps(self, address: int, size: int) -> bool:
        return self.address < address + size and address < self.end


class DramAllocator:
    """First-fit, bottom-up, with coalescing free list, over `size` bytes of backing memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.memory = torch.full((size,), FILL_BYTE, dtype=torch.uint8)
        self._free: list[tuple[int, int]] = [(0, size)]  # (address, size), sorted by address
        self._live: dict[int, Buffer] = {}  # address -> buffer
        self.next_serial = 1
        self.high_water = 0
        """The end of the highest byte ever allocated: DRAM above it was never written."""

    @property
    def live(self) -> list[Buffer]:
        return list(self._live.values())

    @property
    def bytes_free(self) -> int:
        return sum(size for _, size in self._free)

    def allocate(self, nbytes: int) -> Buffer:
        size = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        for i, (address, free_size) in enumerate(self._free):
            if free_size >= size:
                if free_size == size:
                    del self._free[i]
                else:
                    self._free[i] = (address + size, free_size - size)
                buffer = Buffer(self.next_serial, address, size)
                self.high_water = max(self.high_water, address + size)
                self.next_serial += 1
                self._live[address] = buffer
                return buffer
        raise RuntimeError(
            f"Out of Memory: Not enough space to allocate {size} B DRAM buffer "
            f"({self.bytes_free} B free in {len(self._free)} fragments of {self.size} B)"
        )

    def free(self, buffer: Buffer) -> None:
        if not buffer.allocated:
            return
        buffer.allocated = False
        del self._live[buffer.address]
        i = bisect.bisect(self._free, (buffer.address, 0))
        self._free.insert(i, (buffer.address, buffer.size))
        # Coalesce with the right neighbour, then the left one.
        if i + 1 < len(self._free) and buffer.end == self._free[i + 1][0]:
            self._free[i] = (buffer.address, buffer.size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]

    def __getstate__(self) -> dict[str, Any]:
        """The books and the bytes below the high-water mark (above it all are `FILL_BYTE`)."""
        state = self.__dict__.copy()
        state["memory"] = self.memory[: self.high_water].numpy().tobytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        written = state.pop("memory")
        self.__dict__.update(state)
        spare = _take_spare(self.size)
        if spare is None:
            memory = torch.full((self.size,), FILL_BYTE, dtype=torch.uint8)
        else:
            memory, dirty = spare  # above `dirty` it holds FILL_BYTE still
            memory[len(written) : dirty].fill_(FILL_BYTE)
        if written:
            memory.numpy()[: len(written)] = np.frombuffer(written, dtype=np.uint8)
        self.memory = memory

    def recycle(self) -> None:
        """This DRAM will never be read again (its device was discarded): let a restored copy
        reuse the bytes (fresh memory costs page faults; reused memory only a fill)."""
        if len(_SPARE) < _SPARES:
            _SPARE.append((self.memory, self.high_water))
        self.memory = torch.empty(0, dtype=torch.uint8)

    def overlapping(self, address: int, size: int) -> list[Buffer]:
        """Live buffers that share bytes with [address, address + size)."""
        return [b for b in self._live.values() if b.overlaps(address, size)]

    def view(
        self, address: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor:
        """A typed, writable view of DRAM bytes (no copy)."""
        return self.memory[address : address + nbytes].view(dtype).view(shape)

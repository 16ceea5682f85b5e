"""DRAM of the emulated device: a first-fit allocator over a finite region, and its contents.

Like tt-metal's allocator, the books are kept on the host only and never wait for command queues:
a freed address is reusable at once, bottom-up, so a stale reader of a freed buffer reads
whatever was allocated there next. The bytes live in one backing tensor that persists across
frees, so a use-after-free or an early reuse yields real wrong data, as on the chip.

Every allocation is checked against the live buffers (bisecting their sorted addresses): of these
books, and of any other allocator whose buffers lie in the same backing memory (which only a bug
makes happen: a restored copy handed DRAM that another live copy still uses). An overlap is an
"overlapping-allocation" hazard naming both buffers.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .hazards import Hazard, HazardKind, HazardLog

ALIGNMENT = 32  # DRAM buffers start on 32-byte boundaries (also keeps typed views aligned)
FILL_BYTE = 0xA5  # never-written DRAM reads as 0xA5A5…, visibly not a token id


SPARE_HANDED_OUT_TWICE = "spare-handed-out-twice"
PLANTED: dict[str, str] = {
    SPARE_HANDED_OUT_TWICE: "a discarded copy's DRAM is handed to a restored copy but left on the "
                            "spare list, so the next restore gets it too while the first lives",
}
"""Bugs an allocator can be built with (`DramAllocator(planted=...)`), to show its checks live."""


class _Bank:
    """A backing memory and the allocators whose buffers lie in it: one, unless a bug shares it."""

    __slots__ = ("memory", "users")

    def __init__(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self.users: list[DramAllocator] = []


_SPARES = 4
_SPARE: list[tuple[_Bank, int]] = []
"""DRAM of discarded copies, and each one's high-water mark, for restored copies to reuse."""


def _take_spare(size: int, planted: frozenset[str]) -> tuple[_Bank, int] | None:
    for i, (bank, _) in enumerate(_SPARE):
        if bank.memory.numel() == size:
            # The planted bug: handed out, yet still listed for the next restore.
            return _SPARE[i] if SPARE_HANDED_OUT_TWICE in planted else _SPARE.pop(i)
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

    def __init__(self, size: int, *, hazards: HazardLog | None = None,
                 planted: frozenset[str] = frozenset()) -> None:
        """`hazards`: where overlaps are reported (the device's); `planted`: ids of `PLANTED`."""
        unknown = planted - PLANTED.keys()
        if unknown:
            raise ValueError(f"unknown planted allocator bugs {sorted(unknown)}; "
                             f"choose from: {', '.join(PLANTED)}")
        self.size = size
        self.hazards = hazards if hazards is not None else HazardLog()
        self.planted = planted
        self.memory = torch.full((size,), FILL_BYTE, dtype=torch.uint8)
        self._bank = self._join(_Bank(self.memory))
        self._free: list[tuple[int, int]] = [(0, size)]  # (address, size), sorted by address
        self._live: dict[int, Buffer] = {}  # address -> buffer
        self._starts: list[int] = []  # the live buffers' addresses, sorted: the overlap check
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
                # The overlap check, inline (the hot path): live buffers never overlap, so only
                # the neighbours of `address` in the sorted starts can; the slow path names them.
                starts, live = self._starts, self._live
                j = bisect.bisect_right(starts, address)
                clash = (
                    (j and live[starts[j - 1]].end > address)
                    or (j < len(starts) and starts[j] < address + size)
                    or len(self._bank.users) > 1  # never, unless a bug handed this DRAM out twice
                ) and self._clash(address, size)
                self.high_water = max(self.high_water, address + size)
                self.next_serial += 1
                live[address] = buffer
                starts.insert(j, address)
                if clash:
                    self._report_overlap(buffer, *clash)
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
        del self._starts[bisect.bisect_left(self._starts, buffer.address)]
        i = bisect.bisect(self._free, (buffer.address, 0))
        self._free.insert(i, (buffer.address, buffer.size))
        # Coalesce with the right neighbour, then the left one.
        if i + 1 < len(self._free) and buffer.end == self._free[i + 1][0]:
            self._free[i] = (buffer.address, buffer.size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]

    def _join(self, bank: _Bank) -> _Bank:
        bank.users.append(self)
        return bank

    def _clash(self, address: int, size: int) -> tuple[Buffer, bool] | None:
        """A live buffer sharing bytes with [address, address + size), and whether another
        allocator on this memory holds it; None if none does."""
        found = self._live_at(address, size)
        if found is not None:
            return found, False
        if len(self._bank.users) > 1:  # never, unless a bug handed this memory out twice
            found = self._elsewhere(address, size)
            if found is not None:
                return found, True
        return None

    def _elsewhere(self, address: int, size: int) -> Buffer | None:
        """A live buffer of another allocator on this memory sharing bytes with the range."""
        for other in self._bank.users:
            found = None if other is self else other._live_at(address, size)
            if found is not None:
                return found
        return None

    def _live_at(self, address: int, size: int) -> Buffer | None:
        """One live buffer of these books sharing bytes with [address, address + size): live
        buffers never overlap, so only the neighbours of `address` can (O(log n))."""
        starts = self._starts
        i = bisect.bisect_right(starts, address)
        if i and self._live[starts[i - 1]].end > address:
            return self._live[starts[i - 1]]
        if i < len(starts) and starts[i] < address + size:
            return self._live[starts[i]]
        return None

    def _report_overlap(self, buffer: Buffer, live: Buffer, other: bool,
                        *, restored: bool = False) -> None:
        """Report `buffer` sharing bytes with `live` (another allocator's if `other`); found at
        a restore, it is raised by the device's next call (a restore cannot raise)."""
        held = f"{live.label} of another live allocator on this DRAM" if other else live.label
        verb = "was restored into DRAM holding" if restored else "was allocated over"
        low, high = max(buffer.address, live.address), min(buffer.end, live.end)
        self.hazards.report(
            Hazard(
                HazardKind.OVERLAPPING_ALLOCATION,
                f"{buffer.label} {verb} live {held}: bytes [0x{low:x}, 0x{high:x}) belong to "
                "both, so each overwrites the other",
                buffers=(buffer.label, held),
            ),
            can_raise=not restored,
        )

    def __getstate__(self) -> dict[str, Any]:
        """The books and the bytes below the high-water mark (above it all are `FILL_BYTE`)."""
        state = self.__dict__.copy()
        state["memory"] = self.memory[: self.high_water].numpy().tobytes()
        del state["_bank"]  # who shares the memory is not state: a copy gets memory of its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        written = state.pop("memory")
        self.__dict__.update(state)
        spare = _take_spare(self.size, self.planted)
        if spare is None:
            bank = _Bank(torch.full((self.size,), FILL_BYTE, dtype=torch.uint8))
        else:
            bank, dirty = spare  # above `dirty` it holds FILL_BYTE still
            bank.memory[len(written) : dirty].fill_(FILL_BYTE)
        if written:
            bank.memory.numpy()[: len(written)] = np.frombuffer(written, dtype=np.uint8)
        self.memory = bank.memory
        self._bank = self._join(bank)
        if len(bank.users) > 1:
            self._check_restored()

    def _check_restored(self) -> None:
        """The restored live buffers against those of the memory's other users (the first
        overlap is reported: one is enough to fail the run)."""
        for address in self._starts:
            buffer = self._live[address]
            found = self._elsewhere(buffer.address, buffer.size)
            if found is not None:
                self._report_overlap(buffer, found, True, restored=True)
                return

    def recycle(self) -> None:
        """This DRAM will never be read again (its device was discarded): let a restored copy
        reuse the bytes (fresh memory costs page faults; reused memory only a fill)."""
        self._bank.users.remove(self)
        if len(_SPARE) < _SPARES:
            _SPARE.append((self._bank, self.high_water))
        self.memory = torch.empty(0, dtype=torch.uint8)
        self._bank = self._join(_Bank(self.memory))

    def share(self, memory: torch.Tensor) -> None:
        """Back this DRAM with `memory` (the device process's shared memory), bytes copied."""
        memory.copy_(self.memory)
        self._bank.memory = memory
        self.memory = memory

    def overlapping(self, address: int, size: int) -> list[Buffer]:
        """Live buffers that share bytes with [address, address + size)."""
        return [b for b in self._live.values() if b.overlaps(address, size)]

    def view(
        self, address: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor:
        """A typed, writable view of DRAM bytes (no copy)."""
        return self.memory[address : address + nbytes].view(dtype).view(shape)

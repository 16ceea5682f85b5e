"""The ring: K persistent device buffers of sampled ids; step n's sampler writes slot n mod K.

Each slot is a [1, 1, 1, padded_rows] uint32 ROW_MAJOR tensor: what both samplers write through
`output_tensor=` (`argmax` must write UINT32 ROW_MAJOR; `sampling` writes [1, 1, 1, users]). The
ring is allocated once at load, before any trace capture, and is never reallocated or freed while
a trace that reads or writes it is alive: a replay runs at the captured addresses with no
allocator checks, so a moved slot would be written over blindly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import ttnn

from .api import Ttnn
from .backend import padded_rows
from .devices import ttnn_for


def ids_shape(width: int) -> list[int]:
    """One id per row, as the samplers lay them out: [1, 1, 1, users]."""
    return [1, 1, 1, width]


def host_uint32(tt: Ttnn, values: list[int] | tuple[int, ...], width: int) -> ttnn.Tensor:
    """A [1, 1, 1, width] uint32 ROW_MAJOR host tensor (-1 wraps as on the device)."""
    row = torch.zeros(ids_shape(width), dtype=torch.int32)
    if values:
        row[0, 0, 0, : len(values)] = torch.tensor(values, dtype=torch.int64).to(torch.int32)
    return tt.from_torch(row, dtype=ttnn.uint32, layout=ttnn.ROW_MAJOR_LAYOUT)


def allocate_ids(
    device: Any, width: int, layout: ttnn.Layout = ttnn.ROW_MAJOR_LAYOUT
) -> ttnn.Tensor:
    """One persistent [1, 1, 1, width] uint32 device tensor, zero-filled so no kernel ever
    consumes uninitialised DRAM as an index: by a host copy when ROW_MAJOR (host tensors are
    ROW_MAJOR off a chip, and a copy keeps the layout), by `fill` on the device when TILE."""
    tt = ttnn_for(device)
    shape = ttnn.Shape(ids_shape(width))
    tensor = tt.allocate_tensor_on_device(shape, ttnn.uint32, layout, device)
    if layout == ttnn.ROW_MAJOR_LAYOUT:
        tt.copy_host_to_device_tensor(host_uint32(tt, [], width), tensor, cq_id=0)
    else:
        with tt.command_queue(0):
            tt.fill(tensor, 0, output_tensor=tensor)
    return tensor


class LogprobSlot(NamedTuple):
    """The logprob ring's part of one slot, written by the same step as the slot's ids."""

    values: ttnn.Tensor
    """[1, 1, W, 1 + n] float32 ROW_MAJOR: each row's sampled logprob, then its top n."""
    ids: ttnn.Tensor
    """[1, 1, W, n] uint32 ROW_MAJOR: the ids of the top n, most likely first."""


def allocate_logprobs(device: Any, width: int, n: int) -> LogprobSlot:
    """One slot of the logprob ring, zero-filled by host copies (ROW_MAJOR, as the ids)."""
    tt = ttnn_for(device)
    values = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1, width, 1 + n]), ttnn.float32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    ids = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1, width, n]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    for tensor, dtype, torch_dtype, last in ((values, ttnn.float32, torch.float32, 1 + n),
                                             (ids, ttnn.uint32, torch.int32, n)):
        zeros = torch.zeros(1, 1, width, last, dtype=torch_dtype)
        host = tt.from_torch(zeros, dtype=dtype, layout=ttnn.ROW_MAJOR_LAYOUT)
        tt.copy_host_to_device_tensor(host, tensor, cq_id=0)
    return LogprobSlot(values, ids)


class DraftSlot(NamedTuple):
    """The draft part of one slot (spec rule 13), written by the launch that verifies; the slot's
    ids are the newest tokens."""

    tokens: tuple[ttnn.Tensor, ...]
    """K + 1 [1, 1, 1, W] uint32 ROW_MAJOR: the target's token on each input lane (the sampler
    writes them, as it writes the ids without drafts)."""
    count: ttnn.Tensor
    """[1, 1, 1, W] uint32 TILE: a + 1, the accepted drafts and the target's token after them."""
    position: ttnn.Tensor
    """[1, 1, 1, W] uint32 TILE: the newest token's position, advanced by a + 1."""
    drafts: tuple[ttnn.Tensor, ...]
    """K [1, 1, 1, W] uint32 TILE: the drafter's proposals after the newest token."""
    logprobs: tuple[LogprobSlot, ...] = ()
    """With a logprob ring: the logprob parts of lanes 1..K (lane 0's is the slot's own), each
    lane's token's logprobs, so that every delivered token of a run has its entry."""

    def tensors(self) -> tuple[ttnn.Tensor, ...]:
        """Every tensor of the part, in one order (allocation checks, release)."""
        return (*self.tokens, self.count, self.position, *self.drafts,
                *(t for part in self.logprobs for t in part))


def allocate_drafts(device: Any, width: int, k: int, logprobs: int = 0) -> DraftSlot:
    """One slot's draft part, zero-filled (TILE: gather and where read them in the combine)."""
    return DraftSlot(
        tokens=tuple(allocate_ids(device, width) for _ in range(k + 1)),
        count=allocate_ids(device, width, ttnn.TILE_LAYOUT),
        position=allocate_ids(device, width, ttnn.TILE_LAYOUT),
        drafts=tuple(allocate_ids(device, width, ttnn.TILE_LAYOUT) for _ in range(k)),
        logprobs=tuple(allocate_logprobs(device, width, logprobs) for _ in range(k))
        if logprobs else (),
    )


class Ring:
    """K slots, allocated together; `seal()` once a trace captured them. With `logprobs` n > 0,
    each slot has a second part, the logprob ring's: the same lifetime, written by the same
    step, read back under the same event (one ownership rule for both). With `drafts` K > 0,
    each slot has a draft part (`DraftSlot`), under the same rule (with logprobs, it holds the
    logprob parts of the draft lanes too)."""

    def __init__(self, device: Any, rows: int, slots: int, logprobs: int = 0,
                 drafts: int = 0) -> None:
        self.tt = ttnn_for(device)
        self.width = padded_rows(rows)
        self.slots: list[ttnn.Tensor] = [allocate_ids(device, self.width) for _ in range(slots)]
        self.logprobs: list[LogprobSlot] = (
            [allocate_logprobs(device, self.width, logprobs) for _ in range(slots)]
            if logprobs else []
        )
        self.drafts: list[DraftSlot] = (
            [allocate_drafts(device, self.width, drafts, logprobs) for _ in range(slots)]
            if drafts else []
        )
        self.addresses = [slot.buffer_address() for slot in self.slots]
        self._at_load = [self._addresses(k) for k in range(slots)]
        self.sealed = False

    def _addresses(self, slot: int) -> tuple[int, ...]:
        return tuple(t.buffer_address() for t in self._tensors(slot))

    def _tensors(self, slot: int) -> tuple[ttnn.Tensor, ...]:
        part = self.drafts[slot].tensors() if self.drafts else ()
        return (self.slots[slot], *(self.logprobs[slot] if self.logprobs else ()), *part)

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, slot: int) -> ttnn.Tensor:
        return self.slots[slot]

    def source_of(self, slot: int) -> int:
        """The slot the previous step wrote: what the combine for `slot` reads (its ids and,
        with drafts, its draft part)."""
        return (slot - 1) % len(self.slots)

    def seal(self) -> None:
        """A trace now holds the slots' addresses: they must stay put until it is released."""
        self.sealed = True

    def unseal(self) -> None:
        """The traces that held the addresses were released."""
        self.sealed = False

    def check(self) -> None:
        """Every slot still allocated at the address it had at load."""
        for k in range(len(self.slots)):
            freed = not all(t.is_allocated() for t in self._tensors(k))
            if freed or self._addresses(k) != self._at_load[k]:
                raise RuntimeError(
                    f"ring slot {k} was freed or moved after load; a trace replay would write "
                    "over whatever lives there now"
                )

    def release(self) -> None:
        """Free the ring (only at close, after the traces that use it were released)."""
        if self.sealed:
            raise RuntimeError("release the decode traces before freeing the ring they replay into")
        for k in range(len(self.slots)):
            for tensor in self._tensors(k):
                self.tt.deallocate(tensor)
        self.slots, self.logprobs, self.drafts = [], [], []

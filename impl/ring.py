"""The ring: K persistent device buffers of sampled ids; step n's sampler writes slot n mod K.

Each slot is a [1, 1, 1, padded_rows] uint32 ROW_MAJOR tensor: what both samplers write through
`output_tensor=` (`argmax` must write UINT32 ROW_MAJOR; `sampling` writes [1, 1, 1, users]). The
ring is allocated once at load, before any trace capture, and is never reallocated or freed while
a trace that reads or writes it is alive: a replay runs at the captured addresses with no
allocator checks, so a moved slot would be written over blindly.
"""

from __future__ import annotations

from typing import Any

import torch
import ttnn

from .backend import padded_rows


def ids_shape(width: int) -> list[int]:
    """One id per row, as the samplers lay them out: [1, 1, 1, users]."""
    return [1, 1, 1, width]


def host_uint32(values: list[int] | tuple[int, ...], width: int) -> ttnn.Tensor:
    """A [1, 1, 1, width] uint32 ROW_MAJOR host tensor (-1 wraps as on the device)."""
    row = torch.zeros(ids_shape(width), dtype=torch.int32)
    if values:
        row[0, 0, 0, : len(values)] = torch.tensor(values, dtype=torch.int64).to(torch.int32)
    return ttnn.from_torch(row, dtype=ttnn.uint32, layout=ttnn.ROW_MAJOR_LAYOUT)


def allocate_ids(
    device: Any, width: int, layout: ttnn.Layout = ttnn.ROW_MAJOR_LAYOUT
) -> ttnn.Tensor:
    """One persistent [1, 1, 1, width] uint32 device tensor, zero-filled so no kernel ever
    consumes uninitialised DRAM as an index: by a host copy when ROW_MAJOR (host tensors are
    ROW_MAJOR off a chip, and a copy keeps the layout), by `fill` on the device when TILE."""
    shape = ttnn.Shape(ids_shape(width))
    tensor = ttnn.allocate_tensor_on_device(shape, ttnn.uint32, layout, device)
    if layout == ttnn.ROW_MAJOR_LAYOUT:
        ttnn.copy_host_to_device_tensor(host_uint32([], width), tensor, cq_id=0)
    else:
        with ttnn.command_queue(0):
            ttnn.fill(tensor, 0, output_tensor=tensor)
    return tensor


class Ring:
    """K slots, allocated together; `seal()` once a trace captured them."""

    def __init__(self, device: Any, rows: int, slots: int) -> None:
        self.width = padded_rows(rows)
        self.slots: list[ttnn.Tensor] = [allocate_ids(device, self.width) for _ in range(slots)]
        self.addresses = [slot.buffer_address() for slot in self.slots]
        self.sealed = False

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, slot: int) -> ttnn.Tensor:
        return self.slots[slot]

    def source_of(self, slot: int) -> ttnn.Tensor:
        """The slot the previous step wrote: what the combine for `slot` reads."""
        return self.slots[(slot - 1) % len(self.slots)]

    def seal(self) -> None:
        """A trace now holds the slots' addresses: they must stay put until it is released."""
        self.sealed = True

    def unseal(self) -> None:
        """The traces that held the addresses were released."""
        self.sealed = False

    def check(self) -> None:
        """Every slot still allocated at the address it had at load."""
        for k, slot in enumerate(self.slots):
            if not slot.is_allocated() or slot.buffer_address() != self.addresses[k]:
                raise RuntimeError(
                    f"ring slot {k} was freed or moved after load; a trace replay would write "
                    "over whatever lives there now"
                )

    def release(self) -> None:
        """Free the ring (only at close, after the traces that use it were released)."""
        if self.sealed:
            raise RuntimeError("release the decode traces before freeing the ring they replay into")
        for slot in self.slots:
            ttnn.deallocate(slot)
        self.slots = []

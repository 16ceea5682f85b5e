"""The probe model on a TT device: forward and greedy sample, the sampler writing a ring slot.

    index  = add(input_ids, positions)                  # [1, 1, 1, W] uint32: token + position
    grid   = add(index, zeros)                          # [1, 1, V, W]: broadcast over V rows
    logits = gather(table, dim=3, index=grid)           # [1, 1, V, W] float32: column i one-hot
    argmax(logits, dim=2, keepdim=True, output_tensor=slot)   # [1, 1, 1, W] uint32 ROW_MAJOR

`table` is the probe's [V + P, V] one-hot table transposed ([1, 1, V, V + P]): column x is
one-hot at perm[x mod V], so gathering column `token + pos` for every row v gives row i's logits
down a column, and the argmax over dimension 2 is the sampled token, laid out as the ring slot
([1, 1, 1, users], the samplers' shape). Every call is one the installed ttnn documents: gather
on TILE (float32 input, uint32 index), add in both layouts, argmax over dimension rank-2 writing
UINT32 ROW_MAJOR. Every output is a persistent tensor allocated at load, so the forward allocates
nothing per step and can be captured in a trace. The numerics are `probe.py`'s.
"""

from __future__ import annotations

from typing import Any

import torch
import ttnn

from .probe import ProbeSpec, logits_table
from .ring import allocate_ids


class TtProbeModel:
    def __init__(self, device: Any, spec: ProbeSpec, width: int, cq: int = 0) -> None:
        self.cq = cq
        vocab = spec.vocab
        table = logits_table(spec).T.contiguous().reshape(1, 1, vocab, -1)
        self.table = ttnn.from_torch(
            table, dtype=ttnn.float32, layout=ttnn.TILE_LAYOUT, device=device, cq_id=cq
        )
        self.zeros = ttnn.from_torch(
            torch.zeros(1, 1, vocab, width, dtype=torch.int32),
            dtype=ttnn.uint32,
            layout=ttnn.TILE_LAYOUT,
            device=device,
            cq_id=cq,
        )
        self.index = allocate_ids(device, width, ttnn.TILE_LAYOUT)
        self.grid, self.logits = (
            ttnn.allocate_tensor_on_device(
                ttnn.Shape([1, 1, vocab, width]), dtype, ttnn.TILE_LAYOUT, device
            )
            for dtype in (ttnn.uint32, ttnn.float32)
        )

    def forward(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor, slot: ttnn.Tensor) -> None:
        """Enqueue forward + sample; the sampler writes straight into `slot`."""
        with ttnn.command_queue(self.cq):
            ttnn.add(input_ids, positions, output_tensor=self.index)
            ttnn.add(self.index, self.zeros, output_tensor=self.grid)
            ttnn.gather(self.table, 3, self.grid, out=self.logits)
            ttnn.argmax(self.logits, dim=2, keepdim=True, output_tensor=slot)

"""The probe model on a TT device: forward and greedy sample, the sampler writing a ring slot.

    index  = add(input_ids, positions)                     # uint32
    logits = embedding(index, table)                       # [1, rows, V] float32, one-hot rows
    argmax(logits, dim=-1, output_tensor=slot)             # the sampled ids land in the slot

Every output is a persistent tensor allocated at load, so the forward allocates nothing per step
and can be captured in a trace. The table and its numerics are `probe.py`'s.
"""

from __future__ import annotations

from typing import Any

import ttnn

from .probe import ProbeSpec, logits_table
from .ring import allocate_ids


class TtProbeModel:
    def __init__(self, device: Any, spec: ProbeSpec, width: int, cq: int = 0) -> None:
        self.cq = cq
        self.table = ttnn.from_torch(
            logits_table(spec),
            dtype=ttnn.float32,
            layout=ttnn.ROW_MAJOR_LAYOUT,
            device=device,
            cq_id=cq,
        )
        self.index = allocate_ids(device, width)
        self.logits = ttnn.allocate_tensor_on_device(
            ttnn.Shape([1, width, spec.vocab]), ttnn.float32, ttnn.ROW_MAJOR_LAYOUT, device
        )

    def forward(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor, slot: ttnn.Tensor) -> None:
        """Enqueue forward + sample; the sampler writes straight into `slot`."""
        with ttnn.command_queue(self.cq):
            ttnn.add(input_ids, positions, output_tensor=self.index)
            ttnn.embedding(self.index, self.table, output_tensor=self.logits)
            ttnn.argmax(self.logits, dim=-1, output_tensor=slot)

"""The probe model on a TT device: forward and sample, the sampler writing a ring slot.

Greedy (`ProbeSpec.sampling` None):

    index  = add(input_ids, positions)                  # [1, 1, 1, W] uint32: token + position
    grid   = add(index, zeros)                          # [1, 1, V, W]: broadcast over V rows
    logits = gather(table, dim=3, index=grid)           # [1, 1, V, W] float32: column i = row
    argmax(logits, dim=2, keepdim=True, output_tensor=slot)   # [1, 1, 1, W] uint32 ROW_MAJOR

Seeded (top-k 2 over each table row's two choices, keyed by (request, position)):

    index  = add(input_ids, positions)
    onehot = eq(index, rows)                            # [1, 1, V + P, W] uint32: column i one-hot
    onehot = typecast(onehot -> bfloat16)
    logits = matmul(onehot, table, transpose_a=True)    # [1, 1, W, V] bfloat16: one row per row
    sampling(logits, indices, k, p, temp, seed, output_tensor=slot)   # identity: requests, pos

`table` is the probe's [V + P, V] logits table (`probe.py`): transposed ([1, 1, V, V + P], float32)
for the greedy gather, as is ([1, 1, V + P, V], bfloat16) for the seeded matmul. Every call is
one the installed ttnn documents: gather on TILE (float32 input, uint32 index), add and eq in both
layouts, typecast on TILE, matmul on bfloat16 TILE, argmax over dimension rank-2 writing UINT32
ROW_MAJOR, sampling on bfloat16 TILE values with a power-of-2 multiple of 32 vocabulary. Every
output is a persistent tensor allocated at load, so the forward allocates nothing per step and
can be captured in a trace.
"""

from __future__ import annotations

from typing import Any

import torch
import ttnn

from .devices import provider_of, ttnn_for
from .probe import SAMPLING_K, ProbeSpec, logits_table
from .ring import LogprobSlot, allocate_ids


def _tile(device: Any, values: torch.Tensor, dtype: ttnn.DataType, cq: int) -> ttnn.Tensor:
    tt = ttnn_for(device)
    return tt.from_torch(values, dtype=dtype, layout=ttnn.TILE_LAYOUT, device=device, cq_id=cq)


def _row_major(device: Any, values: torch.Tensor, dtype: ttnn.DataType, cq: int) -> ttnn.Tensor:
    tt = ttnn_for(device)
    return tt.from_torch(
        values, dtype=dtype, layout=ttnn.ROW_MAJOR_LAYOUT, device=device, cq_id=cq
    )


class GreedyHead:
    """The greedy probe forward over a one-hot table ([V + P, V] float32, `probe.py`'s shape):
    the target's (`logits_table`) or the drafter's (`drafts.draft_table`). Its table, index,
    grid and logits are allocated at load."""

    def __init__(self, device: Any, table: torch.Tensor, width: int, cq: int = 0) -> None:
        self.tt = ttnn_for(device)
        rows, vocab = table.shape
        self.cq = cq
        self.index = allocate_ids(device, width, ttnn.TILE_LAYOUT)
        self.table = _tile(device, table.T.contiguous().reshape(1, 1, vocab, rows),
                           ttnn.float32, cq)
        self.zeros = _tile(device, torch.zeros(1, 1, vocab, width, dtype=torch.int32),
                           ttnn.uint32, cq)
        self.grid, self.logits = (
            self.tt.allocate_tensor_on_device(
                ttnn.Shape([1, 1, vocab, width]), dtype, ttnn.TILE_LAYOUT, device
            )
            for dtype in (ttnn.uint32, ttnn.float32)
        )

    def forward(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor, out: ttnn.Tensor) -> None:
        """Enqueue the table's argmax after each input id at its position into `out` (uint32
        ROW_MAJOR)."""
        with self.tt.command_queue(self.cq):
            self.tt.add(input_ids, positions, output_tensor=self.index)
            self.tt.add(self.index, self.zeros, output_tensor=self.grid)
            self.tt.gather(self.table, 3, self.grid, out=self.logits)
            self.tt.argmax(self.logits, dim=2, keepdim=True, output_tensor=out)


class TtProbeModel:
    def __init__(
        self, device: Any, spec: ProbeSpec, width: int, cq: int = 0, *, requests: Any = None,
    ) -> None:
        """`requests`: the device tensor of each row's request id (the seeded sampler's key)."""
        self.tt = ttnn_for(device)
        self.device = device
        self.cq = cq
        self.spec = spec
        self._provider = provider_of(device)  # tells an emulated sampler each row's identity
        vocab, rows = spec.vocab, spec.vocab + spec.max_positions
        if spec.sampling is None:
            self.head: GreedyHead | None = GreedyHead(device, logits_table(spec), width, cq)
            self.index = self.head.index
            return
        self.head = None
        self.index = allocate_ids(device, width, ttnn.TILE_LAYOUT)
        if requests is None:
            raise ValueError("the seeded probe needs each row's request id on the device")
        self.requests = requests
        table = logits_table(spec).reshape(1, 1, rows, vocab)
        self.table = _tile(device, table, ttnn.bfloat16, cq)
        self.rows = _tile(device, torch.arange(rows, dtype=torch.int32).reshape(1, 1, rows, 1),
                          ttnn.uint32, cq)
        self.onehot = self.tt.allocate_tensor_on_device(
            ttnn.Shape([1, 1, rows, width]), ttnn.uint32, ttnn.TILE_LAYOUT, device
        )
        self.onehot_bf16 = self.tt.allocate_tensor_on_device(
            ttnn.Shape([1, 1, rows, width]), ttnn.bfloat16, ttnn.TILE_LAYOUT, device
        )
        self.logits = self.tt.allocate_tensor_on_device(
            ttnn.Shape([1, 1, width, vocab]), ttnn.bfloat16, ttnn.TILE_LAYOUT, device
        )
        self.indices = _row_major(
            device, torch.arange(vocab, dtype=torch.int32).repeat(width, 1).reshape(
                1, 1, width, vocab), ttnn.int32, cq,
        )
        self.k = _row_major(device, torch.full((width,), SAMPLING_K, dtype=torch.int32),
                            ttnn.uint32, cq)
        self.p, self.temp = (
            _row_major(device, torch.ones(width, dtype=torch.bfloat16), ttnn.bfloat16, cq)
            for _ in range(2)
        )

    def forward(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor, slot: ttnn.Tensor,
                logprobs: LogprobSlot | None = None) -> None:
        """Enqueue forward + sample; the sampler writes straight into `slot`."""
        if logprobs is not None:
            raise ValueError("the probe forward computes no logprobs")
        if self.head is not None:
            self.head.forward(input_ids, positions, slot)
            return
        with self.tt.command_queue(self.cq):
            self.tt.add(input_ids, positions, output_tensor=self.index)
            self.tt.eq(self.index, self.rows, output_tensor=self.onehot)
            self.tt.typecast(self.onehot, ttnn.bfloat16, output_tensor=self.onehot_bf16)
            self.tt.matmul(self.onehot_bf16, self.table, transpose_a=True,
                        optional_output_tensor=self.logits)
            requests, keyed_positions = self._sampling_key(positions)
            self._provider.bind_sampling_identity(self.device, requests, keyed_positions)
            assert self.spec.sampling is not None  # seeded: the greedy head returned above
            self.tt.sampling(self.logits, self.indices, self.k, self.p, self.temp,
                          seed=int(self.spec.sampling), output_tensor=slot)

    def _sampling_key(self, positions: ttnn.Tensor) -> tuple[Any, ttnn.Tensor]:
        """What a seeded draw is keyed on: each row's request and position."""
        return self.requests, positions

"""Per-request state rows on a TT device (spec rule 14): model runner v2's request state.

One state row per request, allocated at admission by the host and held until it closes; the
device keeps there what the host does not know while the request's steps are in flight: its
newest token and, with drafts, that token's position (`num_computed_tokens`) and the drafter's K
proposals after it. Each tensor is [1, 1, 1, W] uint32 TILE (what `gather` and `where` take; W
the table's padded rows, which may differ from a step's: a gather's output takes its index's),
allocated at load beside the ring, before any trace capture, and never moved while a trace
replays into it.

A step's combine gathers each device row's state through the step's `idx_mapping` (the staged
previous-row map holds it: `combine.py`). The launch's post-update, inside the captured step
after the sampler, scatters each row's output back, as two documented ops the other way round:

    incoming  = add(slot ids, 0 -> TILE)                          # the sampler writes ROW_MAJOR
    writer, written = add(staged inverse map | mask, 0 -> TILE)   # state row -> batch row
    for each state tensor T and the step's value V (ids, with drafts position and drafts[j]):
        merged = where(written, gather(V, dim=3, writer), T)      # a row no one names keeps T
        T      = add(merged, 0)                                   # never where into an operand

Both maps are host data staged with the step's other inputs on the compute queue, so queue
order keeps them after the previous step's post-update and before this step's; nothing is
allocated per step, so eager and traced run the same ops.
"""

from __future__ import annotations

from typing import Any

import ttnn

from .backend import StepInputs
from .devices import ttnn_for
from .ring import DraftSlot, allocate_ids, host_uint32


class StateTable:
    """The state rows' tensors, the post-update's staged maps and its scratch."""

    def __init__(self, device: Any, width: int, rows: int, batch: int, drafts: int = 0) -> None:
        """`rows`: the state rows the host allocates from (the first `rows` of `width`);
        `batch`: the width of a step's rows (the slot the post-update reads)."""
        self.tt = ttnn_for(device)
        tile = ttnn.TILE_LAYOUT
        self.width = width
        self.rows = rows
        self.newest = allocate_ids(device, width, tile)
        self.position = allocate_ids(device, width, tile) if drafts else None
        self.drafts = [allocate_ids(device, width, tile) for _ in range(drafts)]
        # Staged per step (ROW_MAJOR: host writes keep the layout) and their TILE copies.
        self.writer_rows, self.written_rows = allocate_ids(device, width), allocate_ids(device,
                                                                                      width)
        self.writer, self.written, self.gathered, self.merged = (
            allocate_ids(device, width, tile) for _ in range(4))
        self.incoming = allocate_ids(device, batch, tile)
        """The slot's ids as TILE: what the post-update gathers from (batch width)."""

    def stage(self, inputs: StepInputs, cq: int) -> None:
        """The step's inverse map and its mask, written on `cq` (the combine's queue)."""
        writer, written = inputs.scatter(self.rows)
        for values, target in ((writer, self.writer_rows), (written, self.written_rows)):
            host = host_uint32(self.tt, values, self.width)
            self.tt.copy_host_to_device_tensor(host, target, cq_id=cq)

    def post_update(self, ids: ttnn.Tensor, drafts: DraftSlot | None, cq: int) -> None:
        """Scatter the step's output into the state rows its rows name: the newest tokens
        (`ids`, the slot the sampler wrote) and, with drafts, their positions and drafts."""
        with self.tt.command_queue(cq):
            self.tt.add(ids, 0, output_tensor=self.incoming)
            self.tt.add(self.writer_rows, 0, output_tensor=self.writer)
            self.tt.add(self.written_rows, 0, output_tensor=self.written)
            pairs = [(self.incoming, self.newest)]
            if drafts is not None:
                assert self.position is not None
                pairs += [(drafts.position, self.position),
                          *zip(drafts.drafts, self.drafts, strict=True)]
            for value, state in pairs:
                self.tt.gather(value, 3, self.writer, out=self.gathered)
                self.tt.where(self.written, self.gathered, state, output_tensor=self.merged)
                self.tt.add(self.merged, 0, output_tensor=state)

"""The device combine: step N+1's input ids from host ids and step N's slot, built on device.

    source    = add(slot[N mod K], 0 -> TILE)                      # ROW_MAJOR -> TILE
    index, mask, fallback = add(prev_map | use_mirror | host_ids, 0 -> TILE)
    gathered  = gather(source, dim=3, index)                        # row i <- slot[prev_map[i]]
    input_ids = where(mask, gathered, fallback)                     # mirror rows vs host rows

Host ids, the previous-row map, the use-mirror mask and the positions are persistent device
tensors, allocated at load and refilled per step with `copy_host_to_device_tensor` (never
reallocated, so a captured trace keeps reading them). Rows move freely between steps (condense,
reorder, arrivals, finishes, aborts, preemption): the map says where each row's newest token sits
in the previous slot, and the host never needs to know its value.

Layouts, as the installed ttnn documents them: `gather` takes TILE only (input and index) and
`where` takes TILE only (every operand), while the slot is ROW_MAJOR (the samplers write it so)
and host inputs are ROW_MAJOR (a host copy keeps the layout, and off a chip a host tensor cannot
be TILE). So each ROW_MAJOR operand is converted on the device by `add(x, 0, output_tensor=t)`:
add takes UINT32 in both layouts, and "the full tensor spec" of its output is `output_tensor`'s.
The conversions write persistent tensors allocated at load: nothing is allocated per step, so the
same ops run eagerly and inside a captured trace.

With K drafts (spec rule 13) the combine also builds K draft lanes and the rows' base positions,
each through the same map from the previous slot's draft part, host rows taking what the host
staged (its read-back drafts, its count of computed tokens):

    spec, positions, host_draft[j] = add(.., 0 -> TILE)
    lanes[1 + j] = where(mask, gather(slot[N].drafts[j], dim=3, index), host_draft[j])
    base         = where(mask, gather(slot[N].position, dim=3, index), positions)

so lane 0 (`input_ids`) is the newest token and lanes 1..K the drafts after it, the launch's
K + 1 inputs at positions base .. base + K.

With per-request state rows (spec rule 14, `state_rows.py`) the same ops gather from the state
table instead of the previous slot, through the staged `idx_mapping` (a device row's map entry is
its own state row): the table is TILE already, so `source` is the table's newest ids as they are,
and the draft lanes and base positions gather the table's drafts and positions.
"""

from __future__ import annotations

from typing import Any

import ttnn

from .backend import StepInputs
from .devices import ttnn_for
from .ring import DraftSlot, allocate_ids, host_uint32
from .state_rows import StateTable


class DeviceCombine:
    """Persistent step inputs and the two combine ops writing the persistent input ids."""

    def __init__(self, device: Any, width: int, cq: int = 0, other_cq: int | None = None,
                 *, identity: bool = False, drafts: int = 0,
                 table: StateTable | None = None) -> None:
        """`other_cq`: the device's second queue, if it has one (the combine stages on `cq`);
        `identity`: also stage each row's request id (a seeded sampler keys its draws on it);
        `drafts`: K draft lanes (rule 13), 0: none; `table`: the state rows to gather from
        (rule 14), None: the previous slot."""
        self.tt = ttnn_for(device)
        self.width = width
        self.table = table
        self.cq = cq
        self.other_cq = other_cq
        self.requests = allocate_ids(device, width) if identity else None
        """Each row's request id, staged per step (seeded samplers only)."""
        # Written by the host each step: ROW_MAJOR.
        self.host_ids, self.prev_map, self.use_mirror, self.positions = (
            allocate_ids(device, width) for _ in range(4)
        )
        # What gather and where take: TILE.
        self.source, self.index, self.mask, self.fallback, self.gathered = (
            allocate_ids(device, width, ttnn.TILE_LAYOUT) for _ in range(5)
        )
        self.input_ids = allocate_ids(device, width, ttnn.TILE_LAYOUT)
        """What the forward consumes: the combine's output."""
        self.k = drafts
        # With drafts: staged (ROW_MAJOR) spec and host drafts, their TILE copies, the draft
        # lanes and the base positions (allocated only then: no drafts, no change).
        self.spec_rows = allocate_ids(device, width) if drafts else None
        self.host_drafts = [allocate_ids(device, width) for _ in range(drafts)]
        tile = ttnn.TILE_LAYOUT
        self.spec: ttnn.Tensor | None = allocate_ids(device, width, tile) if drafts else None
        """Each row's scheduled drafts (TILE; verification accepts at most these)."""
        self.position_tiles = allocate_ids(device, width, tile) if drafts else None
        self.draft_tiles = [allocate_ids(device, width, tile) for _ in range(drafts)]
        self.lanes = [self.input_ids, *(allocate_ids(device, width, tile) for _ in range(drafts))]
        """The launch's K + 1 input lanes: the newest token, then the K drafts (TILE)."""
        self.base = allocate_ids(device, width, tile) if drafts else None
        """Each row's newest token's position (TILE): lane j sits at base + j."""

    def stage(self, inputs: StepInputs) -> None:
        """Host writes of the step's inputs, in queue order after the previous step's reads."""
        cq = self._stage_cq()
        staged = [
            (inputs.host_ids, self.host_ids),
            (inputs.prev_map, self.prev_map),
            (self._mask(inputs), self.use_mirror),
            (self._positions(inputs), self.positions),
        ]
        if self.requests is not None:
            staged.append((inputs.requests, self.requests))
        if self.spec_rows is not None:
            staged.append((self._spec_column(inputs), self.spec_rows))
            lanes = self._draft_lanes(inputs)
            staged.extend(zip(lanes, self.host_drafts, strict=True))
        for values, target in staged:
            host = host_uint32(self.tt, values, self.width)
            self.tt.copy_host_to_device_tensor(host, target, cq_id=cq)
        if self.table is not None:  # the post-update's maps, on the same queue
            self.table.stage(inputs, cq)

    def _stage_cq(self) -> int:
        """The queue the host inputs are written on: the combine's, so queue order keeps them
        after the previous step's reads and before this step's combine."""
        return self.cq

    def _mask(self, inputs: StepInputs) -> tuple[int, ...]:
        """The use-mirror mask: 1 where a row reads the previous slot."""
        return inputs.use_mirror

    def _positions(self, inputs: StepInputs) -> tuple[int, ...]:
        """The host positions: this step's."""
        return inputs.positions

    def _draft_lanes(self, inputs: StepInputs) -> tuple[tuple[int, ...], ...]:
        """The K host draft lanes: each host row's drafts read back."""
        return inputs.host_drafts(self.k)

    def _spec_column(self, inputs: StepInputs) -> tuple[int, ...]:
        """Each row's scheduled drafts, as data (verification accepts at most these)."""
        return inputs.spec

    def enqueue(self, source: ttnn.Tensor | None, drafts: DraftSlot | None = None) -> None:
        """The device half of the combine, reading `source` (the previous step's slot) and, with
        drafts, `drafts` (that slot's draft part); with state rows both are None and it reads
        the table.

        Rows that take host ids still gather (index 0, discarded by `where`): one op sequence
        for every batch layout, so one captured trace serves them all.
        """
        with self.tt.command_queue(self.cq):
            converted = [
                (self.prev_map, self.index, self._index_offset()),
                (self.use_mirror, self.mask, 0),
                (self.host_ids, self.fallback, 0),
            ]
            if self.table is None:
                assert source is not None
                converted.insert(0, (source, self.source, 0))
            for rows, tiles, plus in converted:
                self.tt.add(rows, plus, output_tensor=tiles)
            newest = self.source if self.table is None else self.table.newest
            self.tt.gather(newest, 3, self.index, out=self.gathered)
            chosen, other = self._where_operands()
            self.tt.where(self.mask, chosen, other, output_tensor=self.input_ids)
            if self.spec_rows is not None:
                self._enqueue_drafts(drafts)

    def _index_offset(self) -> int:
        """What the gather index adds to the previous-row map: nothing."""
        return 0

    def _where_operands(self) -> tuple[ttnn.Tensor, ttnn.Tensor]:
        """`where`'s operands: mirror rows take the gathered ids, host rows the host ids."""
        return self.gathered, self.fallback

    def _enqueue_drafts(self, source: DraftSlot | None) -> None:
        """Draft lanes and base positions through the map (rule 13), from the previous slot's
        draft part or the state rows; on the compute queue."""
        assert self.spec_rows is not None and self.spec is not None
        assert self.position_tiles is not None and self.base is not None
        for rows, tiles in ((self.spec_rows, self.spec), (self.positions, self.position_tiles),
                            *zip(self.host_drafts, self.draft_tiles, strict=True)):
            self.tt.add(rows, 0, output_tensor=tiles)
        outputs = [*self.lanes[1:], self.base]
        if self.table is not None:
            assert self.table.position is not None
            parts = (*self.table.drafts, self.table.position)
        else:
            assert source is not None
            parts = (*source.drafts, source.position)
        for device_part, host, out in zip(parts,
                                          (*self.draft_tiles, self.position_tiles), outputs,
                                          strict=True):
            self.tt.gather(device_part, 3, self.index, out=self.gathered)
            self.tt.where(self.mask, self.gathered, host, output_tensor=out)

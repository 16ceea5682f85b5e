"""Speculative decoding's launch on a TT device (spec rule 13): the target on every input lane,
greedy verification, the newest token, its position, and the drafter's next K proposals.

The combine (`combine.py`) has built K + 1 input lanes (the newest token, then the K drafts) and
the base positions; for slot s (all tensors [1, 1, 1, W] uint32, TILE unless said otherwise):

    for j in 0..K:  pos[j] = add(base, j)                       (lane 0 sits at base itself)
                    target(lanes[j], pos[j]) -> slot[s].tokens[j]       # t_j, ROW_MAJOR
                    tok[j] = add(slot[s].tokens[j], 0 -> TILE)
    m[i]  = eq(lanes[i + 1], tok[i])                            # d_(i+1) == t_i
    m1    = where(eq(spec, 0), 0, m[0])                         # lane 1 counts only if spec >= 1
    K = 1:  a = m1;  newest = where(a, tok[1], tok[0])
    K = 2:  p2 = where(eq(spec, 2), where(m[0], m[1], 0), 0)    # m1 AND m2, only if spec >= 2
            a = add(m1, p2);  newest = where(p2, tok[2], where(m1, tok[1], tok[0]))
    slot[s].ids      = add(newest, 0 -> ROW_MAJOR)              # the ring's ids: the newest
    slot[s].count    = add(a, 1)
    slot[s].position = add(base, slot[s].count)                 # pos + a + 1
    for j in 0..K-1: draft(token, add(slot[s].position, j)) -> slot[s].drafts[j]   (j = 0: as is)
                     (token: the newest, then the previous draft)

`target` is the model's forward and sampler on one lane (`LaneTarget`): the probe's
(`TtProbeModel.forward`, greedy or seeded, through `ProbeLanes`), or a serving decoder's, which
writes the lane's tokens into its KV context and, with a logprob ring, the lane's logprobs (the
seeded sampler keys each lane's draw on (request, its position)). `draft` is the `Drafter`: the
probe's is the greedy forward over its one-hot draft table (`HeadDrafter`); a serving decoder
drafts all K from its context in one op. The mask is a prefix, so it equals the cpu mirror's
`min(accepted, spec)`; every `where` predicate is 0/1. Only add, eq, where, gather and argmax
(and the forwards' own calls), each on a row the installed ttnn documents, and every output is
allocated here at load: nothing is allocated per step, so the launch is captured in the decode
trace as it runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import ttnn

from .combine import DeviceCombine
from .devices import ttnn_for
from .ring import DraftSlot, LogprobSlot, allocate_ids
from .tt_model import GreedyHead, TtProbeModel


class LaneTarget(Protocol):
    def lane(self, j: int, input_ids: ttnn.Tensor, positions: ttnn.Tensor, spec: ttnn.Tensor,
             out: ttnn.Tensor, logprobs: LogprobSlot | None = None) -> None:
        """Enqueue the target's token after input lane `j` at `positions` into `out` (uint32
        ROW_MAJOR); `spec`: each row's scheduled drafts (lanes past them are never used)."""


class Drafter(Protocol):
    def propose(self, newest: ttnn.Tensor, position: ttnn.Tensor,
                out: Sequence[ttnn.Tensor]) -> None:
        """Enqueue the K drafts after each row's `newest` token at `position` into `out`."""


class ProbeLanes:
    """The probe's forward and sampler as a lane target: every lane is the same function."""

    def __init__(self, model: TtProbeModel) -> None:
        self.model = model

    def lane(self, j: int, input_ids: ttnn.Tensor, positions: ttnn.Tensor, spec: ttnn.Tensor,
             out: ttnn.Tensor, logprobs: LogprobSlot | None = None) -> None:
        self.model.forward(input_ids, positions, out, logprobs=logprobs)


class HeadDrafter:
    """The probe's drafter: the greedy forward over its one-hot table (`drafts.draft_table`),
    one call per draft, each from the previous one."""

    def __init__(self, device: Any, table: Any, width: int, cq: int = 0) -> None:
        self.tt = ttnn_for(device)
        self.cq = cq
        self.position = allocate_ids(device, width, ttnn.TILE_LAYOUT)
        self.rows = allocate_ids(device, width)  # what argmax writes: ROW_MAJOR
        self.head = GreedyHead(device, table, width, cq)

    def propose(self, newest: ttnn.Tensor, position: ttnn.Tensor,
                out: Sequence[ttnn.Tensor]) -> None:
        token = newest
        for j, draft in enumerate(out):
            at = position
            if j:
                at = self.position
                with self.tt.command_queue(self.cq):
                    self.tt.add(position, j, output_tensor=at)
            self.head.forward(token, at, self.rows)
            with self.tt.command_queue(self.cq):
                self.tt.add(self.rows, 0, output_tensor=draft)
            token = draft


class DeviceVerify:
    """Scratch of the launch with drafts, and the ops writing a slot around the target's lanes
    and the drafter."""

    def __init__(self, device: Any, k: int, width: int, combine: DeviceCombine,
                 target: LaneTarget, drafter: Drafter, cq: int = 0) -> None:
        self.tt = ttnn_for(device)
        self.k = k
        self.cq = cq
        self.combine = combine
        self.target = target
        self.drafter = drafter
        tile = ttnn.TILE_LAYOUT

        def scratch(n: int) -> list[ttnn.Tensor]:
            return [allocate_ids(device, width, tile) for _ in range(n)]

        assert combine.base is not None
        self.lane_positions = [combine.base, *scratch(k)]
        self.tokens = scratch(k + 1)  # the target's tokens, TILE
        self.matches = scratch(k)
        self.spec_zero, self.m1, self.newest = scratch(3)
        self.second = scratch(5) if k == 2 else []
        """K = 2 only: eq(spec, 2), m1 AND m2, p2, a, where(m1, t1, t0)."""

    def enqueue(self, ids: ttnn.Tensor, slot: DraftSlot,
                logprobs: Sequence[LogprobSlot] | None = None) -> None:
        """The launch that verifies, writing the slot's ids (the newest tokens) and draft part
        (and, with `logprobs`, each lane's logprob part)."""
        lanes, spec, base = self.combine.lanes, self.combine.spec, self.combine.base
        assert spec is not None and base is not None
        for j in range(self.k + 1):
            if j:
                with self.tt.command_queue(self.cq):
                    self.tt.add(base, j, output_tensor=self.lane_positions[j])
            target = slot.tokens[j]
            self.target.lane(j, lanes[j], self.lane_positions[j], spec, target,
                             logprobs[j] if logprobs else None)
            with self.tt.command_queue(self.cq):
                self.tt.add(target, 0, output_tensor=self.tokens[j])
        tok = self.tokens
        with self.tt.command_queue(self.cq):
            for i in range(self.k):
                self.tt.eq(lanes[i + 1], tok[i], output_tensor=self.matches[i])
            self.tt.eq(spec, 0, output_tensor=self.spec_zero)
            self.tt.where(self.spec_zero, 0, self.matches[0], output_tensor=self.m1)
            accepted = self.m1
            if self.k == 1:
                self.tt.where(self.m1, tok[1], tok[0], output_tensor=self.newest)
            else:
                spec_two, m12, p2, accepted, n1 = self.second
                self.tt.eq(spec, 2, output_tensor=spec_two)
                self.tt.where(self.matches[0], self.matches[1], 0, output_tensor=m12)
                self.tt.where(spec_two, m12, 0, output_tensor=p2)
                self.tt.add(self.m1, p2, output_tensor=accepted)
                self.tt.where(self.m1, tok[1], tok[0], output_tensor=n1)
                self.tt.where(p2, tok[2], n1, output_tensor=self.newest)
            self._write_ids(ids, slot)
            self._write_count(accepted, slot)
            self._advance(base, slot)
        self.drafter.propose(self.newest, slot.position, slot.drafts)

    def _write_ids(self, ids: ttnn.Tensor, slot: DraftSlot) -> None:
        """The slot's ids: each row's newest token (its run, the target's tokens, is written
        lane by lane above)."""
        self.tt.add(self.newest, 0, output_tensor=ids)

    def _write_count(self, accepted: ttnn.Tensor, slot: DraftSlot) -> None:
        """A row's count: its accepted drafts and the target's token after them."""
        self.tt.add(accepted, 1, output_tensor=slot.count)

    def _advance(self, base: ttnn.Tensor, slot: DraftSlot) -> None:
        """The newest token's position: advanced by the tokens the row yields."""
        self.tt.add(base, slot.count, output_tensor=slot.position)

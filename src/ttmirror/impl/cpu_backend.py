"""The cpu backend: torch on the host, synchronous, with the same ring and combine as a device.

Everything completes at once, so there is nothing to overlap; it still keeps sampled ids in a
ring of K slots and combines from them through the previous-row map, exactly like the TT
mirror. That is why it may advertise the capability (as the engine's CPU backend does): the
depth-2 pipeline's bookkeeping is the same, and its output is the reference for the TT one.
"""

from __future__ import annotations

from typing import Any

import torch

from .backend import Backend, DraftCopy, Mirror, MirrorSpec, StepInputs, TokenLogprobs
from .drafts import draft_table
from .overrides import built
from .probe import UINT32_MASK, forward_torch, logits_table, sample_torch


class CpuMirror:
    def __init__(self, spec: MirrorSpec) -> None:
        self.spec = spec
        rows = spec.width
        self.ring = [torch.zeros(rows, dtype=torch.int64) for _ in range(spec.slots)]
        self.table = logits_table(spec.probe)
        zeros = torch.zeros(rows, dtype=torch.int64)
        self._host_ids, self._prev_map, self._use_mirror, self._positions, self._requests = (
            zeros.clone() for _ in range(5)
        )
        self.input_ids = zeros.clone()
        """What the forward consumes: the combine's output."""
        self.launches = 0
        k = spec.drafts.k if spec.drafts is not None else 0
        self.k = k
        # With drafts (rule 13) a slot also holds, per row, the target's K + 1 tokens, the
        # count a + 1, the newest token's position and the drafter's K proposals; the step's
        # input has K + 1 lanes (newest, then drafts) and their positions.
        self.ring_tokens = [torch.zeros(k + 1, rows, dtype=torch.int64) for _ in self.ring]
        self.ring_counts = [zeros.clone() for _ in self.ring]
        self.ring_positions = [zeros.clone() for _ in self.ring]
        self.ring_drafts = [torch.zeros(k, rows, dtype=torch.int64) for _ in self.ring]
        self._spec = zeros.clone()
        self._host_drafts = torch.zeros(k, rows, dtype=torch.int64)
        self.input_lanes = torch.zeros(k + 1, rows, dtype=torch.int64)
        self.input_positions = zeros.clone()
        self.draft_table = draft_table(spec.probe, spec.drafts) if spec.drafts else None
        # With state rows (rule 14): per state row the newest token, its position and drafts;
        # the post-update's inverse map and mask, staged per step.
        self.state_rows = spec.state_rows
        table = torch.zeros(spec.table_width, dtype=torch.int64)
        self.table_newest, self.table_positions = table.clone(), table.clone()
        self.table_drafts = torch.zeros(k, spec.table_width, dtype=torch.int64)
        self._writer, self._written = table.clone(), table.clone()

    def stage(self, inputs: StepInputs) -> None:
        n = len(inputs.host_ids)
        # Ids are uint32 on a device: a -1 placeholder wraps exactly as it does there.
        self._host_ids[:n] = torch.tensor(inputs.host_ids) & UINT32_MASK
        self._prev_map[:n] = torch.tensor(inputs.prev_map)
        self._use_mirror[:n] = torch.tensor(inputs.use_mirror)
        self._positions[:n] = torch.tensor(inputs.positions)
        if inputs.requests:
            self._requests[:n] = torch.tensor(inputs.requests)
        if self.k:
            self._spec[:n] = torch.tensor(self._spec_column(inputs))
            lanes = self._draft_lanes(inputs)
            self._host_drafts[:, :n] = torch.tensor(lanes) & UINT32_MASK
        if self.state_rows:
            writer, written = inputs.scatter(self.state_rows)
            self._writer[: self.state_rows] = torch.tensor(writer)
            self._written[: self.state_rows] = torch.tensor(written)

    def _draft_lanes(self, inputs: StepInputs) -> tuple[tuple[int, ...], ...]:
        """The K host draft lanes the combine stages: each host row's drafts read back."""
        return inputs.host_drafts(self.k)

    def _spec_column(self, inputs: StepInputs) -> tuple[int, ...]:
        """Each row's scheduled drafts, as data (verification accepts at most these)."""
        return inputs.spec

    def combine(self, slot: int) -> None:
        src = (slot - 1) % self.spec.slots
        mirror = self._use_mirror > 0

        def through_map(source: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
            return torch.where(mirror, torch.gather(source, 0, self._prev_map), host)

        # The previous slot through the previous-row map, or the state rows through the
        # idx_mapping (rule 14): the same gather, another source.
        newest, drafts, positions = (
            (self.ring[src], self.ring_drafts[src], self.ring_positions[src])
            if not self.state_rows else (self.table_newest, self.table_drafts,
                                         self.table_positions))
        self.input_ids = through_map(newest, self._host_ids)
        if self.k:  # the drafts and the position come from where the newest token does
            self.input_lanes = torch.stack([self.input_ids, *(
                through_map(drafts[j], self._host_drafts[j]) for j in range(self.k))])
            self.input_positions = through_map(positions, self._positions)

    def launch(self, slot: int) -> None:
        if self.k:
            self._verify(slot)
        else:
            self.ring[slot] = self._target(self.input_ids, self._positions)
        if self.state_rows:
            self._post_update(slot)
        self.launches += 1

    def _post_update(self, slot: int) -> None:
        """Rule 14: each row's newest token (with drafts its position and drafts) scattered into
        the state row its idx_mapping entry names; a state row no row names keeps its state."""
        written = self._written > 0

        def scattered(value: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            return torch.where(written, torch.gather(value, 0, self._writer), state)

        self.table_newest = scattered(self.ring[slot], self.table_newest)
        if self.k:
            part = self._draft_part(slot)
            self.table_positions = scattered(self.ring_positions[part], self.table_positions)
            self.table_drafts = torch.stack([scattered(self.ring_drafts[part][j],
                                                       self.table_drafts[j])
                                             for j in range(self.k)])

    def _target(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's token after each input id at its position (its draw, when seeded)."""
        seed = self.spec.probe.sampling
        if seed is None:
            return forward_torch(self.table, ids, positions)
        return sample_torch(self.table, ids, positions, self._requests, seed)

    def _verify(self, slot: int) -> None:
        """Rule 13's launch: the target on every lane, the accepted count (leading drafts equal
        to the target's token before them, at most the row's scheduled drafts), the newest
        token, its position, and the drafter's next K proposals after it."""
        base = self.input_positions
        tokens = torch.stack([self._lane(j, base + j, slot) for j in range(self.k + 1)])
        match = (self.input_lanes[1:] == tokens[:-1]).to(torch.int64)
        lanes = torch.arange(self.k).unsqueeze(1)
        match = match * (lanes < self._spec.unsqueeze(0))  # no draft scheduled: nothing accepted
        accepted = torch.cumprod(match, dim=0).sum(dim=0)
        newest = torch.gather(tokens, 0, accepted.unsqueeze(0)).squeeze(0)
        count = self._counted(accepted)
        position = self._advanced(base, count)
        tokens = self._run(tokens)
        part = self._draft_part(slot)
        self.ring[slot] = newest
        self.ring_tokens[part] = tokens
        self.ring_counts[part] = count
        self.ring_positions[part] = position
        self.ring_drafts[part] = self._propose(newest, position)

    def _counted(self, accepted: torch.Tensor) -> torch.Tensor:
        """A row's count: its accepted drafts and the target's token after them."""
        return accepted + 1

    def _advanced(self, base: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The newest token's position: advanced by the tokens the row yields."""
        return base + count

    def _run(self, tokens: torch.Tensor) -> torch.Tensor:
        """[K + 1, rows]: the run a row yields is the target's tokens, lane by lane."""
        return tokens

    def _draft_part(self, slot: int) -> int:
        """Whose draft part the launch writes: its own slot's."""
        return slot

    def _lane(self, j: int, positions: torch.Tensor, slot: int) -> torch.Tensor:
        """The target's token after input lane j at `positions` (lane j of the slot's step)."""
        return self._target(self.input_lanes[j], positions)

    def _propose(self, newest: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """[K, rows]: the drafter's K proposals after each row's newest token at `position`."""
        assert self.draft_table is not None
        drafts, token = [], newest
        for j in range(self.k):
            token = forward_torch(self.draft_table, token, position + j)
            drafts.append(token)
        return torch.stack(drafts)

    def readback_issue(self, slot: int) -> Any:
        # The copy is the readback: synchronous on the host.
        if self.k:
            counts = tuple(self.ring_counts[slot].tolist())
            return (self.ring[slot].clone(), DraftCopy(
                tokens=tuple(map(tuple, self.ring_tokens[slot].T.tolist())), counts=counts,
                drafts=tuple(map(tuple, self.ring_drafts[slot].T.tolist()))))
        return self.ring[slot].clone()

    def readback_complete(self, pending: Any) -> list[int]:
        ids = pending[0] if self.k else pending
        return [int(v) for v in ids.tolist()]

    def readback_drafts(self, pending: Any) -> DraftCopy:
        if not self.k:
            raise RuntimeError("this mirror was opened without drafts (MirrorSpec.drafts)")
        copy: DraftCopy = pending[1]
        return copy

    def readback_logprobs(self, pending: Any) -> list[TokenLogprobs]:
        raise RuntimeError("the probe forward computes no logprobs (MirrorSpec.logprobs)")

    def abandon(self, pending: Any) -> None:
        pass  # the copy was made on the host at issue: nothing is still writing into it

    def describe(self) -> dict[str, Any]:
        return {"launches": self.launches, "trace": False}

    def close(self) -> None:
        pass


class CpuBackend(Backend):
    name = "cpu"

    def supports_async_sampled_token_readback(self) -> bool:
        return True

    def supports_draft_aware_combine(self) -> bool:
        return True  # its combine takes newest token, position and drafts through the row map

    def device_kind(self) -> str:
        return "cpu"

    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        if spec.trace:
            raise ValueError("the cpu backend has no traces: open the mirror with trace=False")
        if spec.logprobs:
            raise ValueError("the probe forward computes no logprobs: open the mirror with "
                             "logprobs=0, or serve a decoder model (ServingBackend)")
        return built(CpuMirror, spec.overrides)(spec)

    def info(self) -> dict[str, Any]:
        return {"torch": torch.__version__}

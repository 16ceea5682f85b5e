"""A backend wrapper that serves a decoder model through the backend's own mirror.

`ServingBackend(inner, model, sampling)` keeps everything the engine resolves from the backend
(name, device, the async capability) and only changes what the mirror's launch computes: the
model's forward over each row's device-resident context, then the sampler into the ring slot.
The ring, combine, readback and their queue/event ordering stay the inner backend's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import torch

from ..impl.backend import (
    Backend,
    DraftCopy,
    Mirror,
    MirrorSpec,
    TokenLogprobs,
    logprob_rows,
    padded_rows,
)
from ..impl.cpu_backend import CpuBackend, CpuMirror
from ..impl.overrides import built
from ..impl.probe import ProbeSpec
from ..impl.sampling import sample_rows
from .context import (
    NO_ROWS,
    SamplingParams,
    StepContext,
    allowed_table,
    bias_tables,
    constraint_tables,
    decode_lane,
    decode_rows,
    draft_rows,
    row_sampling,
    token_logprobs,
)
from .decoders import decoder_for
from .models import DecoderModel, drafter_for


class ContextStage(Protocol):
    def stage(self, rows: StepContext) -> None: ...


class CpuDecoder:
    """The cpu twin of `DeviceDecoder`: the same numerics on host tensors, synchronous (with a
    `drafter`, also its lanes and the drafter's proposals)."""

    def __init__(
        self, model: DecoderModel, width: int, blocks: int, sampling: SamplingParams,
        drafter: DecoderModel | None = None,
    ) -> None:
        self.model = model
        self.width = width
        self.sampling = sampling
        self.drafter = drafter
        self.history = torch.zeros(blocks, model.max_context, dtype=torch.int64)
        self.rows = NO_ROWS
        self.forwards = 0
        self.logits = torch.zeros(width, model.vocab)
        """The last forward's logits: what the logprobs of its draw come from."""

    def stage(self, rows: StepContext) -> None:
        self.rows = rows

    def _column(self, values: tuple[int, ...]) -> torch.Tensor:
        out = torch.zeros(self.width, dtype=torch.int64)
        out[: len(values)] = torch.tensor(values, dtype=torch.int64)
        return out

    def _tables(self, lane: int = 0) -> list[torch.Tensor]:
        """The staged rows' context tables, as the device op reads them (`decode_rows`'s after
        its ids and positions; the allowed ids of `lane`)."""
        r = self.rows
        table = torch.zeros(self.width, self.model.max_context, dtype=torch.int64)
        for i, ids in enumerate(r.prefill_ids):
            if ids:
                table[i, : len(ids)] = torch.tensor(ids)
        return [self._column(r.active), self._column(r.block), self._column(r.write_at),
                self._column(r.prefill), table, *constraint_tables(r, self.width),
                allowed_table(r, self.width, self.model.vocab, lane + 1)[lane * self.width:],
                *bias_tables(r, self.width, self.model.vocab)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.logits = decode_rows(self.model, self.history, input_ids, positions,
                                  *self._tables())
        self.forwards += 1
        return self._sample(positions)

    def lane(self, j: int, input_ids: torch.Tensor, positions: torch.Tensor,
             spec: torch.Tensor) -> torch.Tensor:
        """Lane j of a step with drafts (`decode_lane`): the target's token after each row's
        lane-j id at `positions`, drawn as plain decoding draws it there."""
        self.logits = decode_lane(self.model, self.history, j, spec, input_ids, positions,
                                  *self._tables(j))
        self.forwards += j == 0
        return self._sample(positions)

    def propose(self, newest: torch.Tensor, position: torch.Tensor, k: int) -> torch.Tensor:
        """[k, rows]: the drafter's proposals after each row's newest token (`draft_rows`)."""
        if self.drafter is None:
            raise RuntimeError("this decoder was loaded without a drafter")
        tables = self._tables()
        return draft_rows(self.drafter, self.history, k, newest, position, tables[0],
                          tables[1], tables[2])

    def _sample(self, positions: torch.Tensor) -> torch.Tensor:
        """The sampler over the last logits: argmax, or the seeded draw of each row's request at
        `positions`."""
        logits, r = self.logits, self.rows
        if self.sampling.greedy:
            return torch.argmax(logits, dim=-1)
        s, v = self.sampling, self.model.vocab
        values = logits.to(torch.bfloat16).reshape(1, 1, self.width, v)  # as the device's typecast
        indices = torch.arange(v).repeat(self.width, 1).reshape(1, 1, self.width, v)
        k, p, inv_t = row_sampling(r, s, self.width)
        return sample_rows(
            values,
            indices,
            k,
            p.to(torch.bfloat16),
            inv_t.to(torch.bfloat16),
            seed=int(s.seed or 0),
            requests=self._column(r.request),
            positions=positions,
        ).reshape(-1)


class _CpuReadback(NamedTuple):
    ids: torch.Tensor
    logprobs: list[tuple[torch.Tensor, torch.Tensor]] | None
    """Per lane (one without drafts): the logprob ring's values and ids."""
    drafts: DraftCopy | None = None


class CpuServingMirror(CpuMirror):
    """CpuMirror's ring and combine; the launch runs the decoder instead of the probe (and fills
    the logprob ring beside the slot, when the spec asks for one). With drafts, CpuMirror's
    verification around the decoder's lanes and drafter."""

    def __init__(self, spec: MirrorSpec, decoder: CpuDecoder) -> None:
        # The probe table is not used here: build the smallest one rather than a [V+P, V] one.
        super().__init__(dataclasses.replace(spec, probe=ProbeSpec(vocab=2, max_positions=1)))
        self.spec = spec
        self.decoder = decoder
        self.logprob_ring: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = (
            [None] * spec.slots)
        self._lanes: list[tuple[torch.Tensor, torch.Tensor]] = []  # this launch's logprobs

    def launch(self, slot: int) -> None:
        self._lanes = []
        if self.k:
            self._verify(slot)  # the lanes and the drafter below
        else:
            self.ring[slot] = self.decoder.forward(self.input_ids, self._positions)
            self._logprobs(self.ring[slot])
        if self.spec.logprobs:
            self.logprob_ring[slot] = self._lanes
        self.launches += 1

    def _logprobs(self, tokens: torch.Tensor) -> None:
        """The logprobs of the tokens the last forward drew, as the lane's ring entry."""
        if self.spec.logprobs:
            self._lanes.append(token_logprobs(self.decoder.logits, tokens, self.spec.logprobs))

    def _lane(self, j: int, positions: torch.Tensor, slot: int) -> torch.Tensor:
        tokens = self.decoder.lane(j, self.input_lanes[j], positions, self._spec)
        self._logprobs(tokens)
        return tokens

    def _propose(self, newest: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.decoder.propose(newest, position, self.k)

    def readback_issue(self, slot: int) -> _CpuReadback:
        part = self.logprob_ring[slot]
        drafts = super().readback_issue(slot)[1] if self.k else None
        return _CpuReadback(self.ring[slot].clone(),
                            None if part is None else [(v.clone(), i.clone()) for v, i in part],
                            drafts)

    def readback_complete(self, pending: Any) -> list[int]:
        return [int(v) for v in pending.ids.tolist()]

    def readback_drafts(self, pending: Any) -> DraftCopy:
        if pending.drafts is None:
            raise RuntimeError("this mirror was opened without drafts (MirrorSpec.drafts)")
        copy: DraftCopy = pending.drafts
        return copy

    def readback_logprobs(self, pending: Any) -> list[TokenLogprobs]:
        if pending.logprobs is None:
            raise RuntimeError("this mirror was opened without logprobs (MirrorSpec.logprobs)")
        rows: list[TokenLogprobs] = []
        for values, ids in pending.logprobs:  # lane-major, as the tt mirror's
            rows += logprob_rows(values.tolist(), ids.tolist())
        return rows


class ServingBackend(Backend):
    """`inner` ("tt" or "cpu" backend) serving `model` with `sampling`."""

    def __init__(
        self,
        inner: Backend,
        model: DecoderModel,
        sampling: SamplingParams | None = None,
    ) -> None:
        self.inner = inner
        self.model = model
        self.sampling = sampling or SamplingParams()
        self.name = inner.name
        self.reports_device_waits = inner.reports_device_waits
        self.context: ContextStage | None = None
        """The opened mirror's context stager: the engine stages each step's rows through it."""
        self.drafter: DecoderModel | None = None
        """The model proposing drafts on the device, when the mirror was opened with drafts."""

    def supports_async_sampled_token_readback(self) -> bool:
        return self.inner.supports_async_sampled_token_readback()

    def supports_draft_aware_combine(self) -> bool:
        # The inner mirror's combine; the launch verifies with the model's lanes and drafter.
        return self.inner.supports_draft_aware_combine()

    def device_kind(self) -> str:
        return self.inner.device_kind()

    def info(self) -> dict[str, Any]:
        return self.inner.info()

    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        blocks = spec.rows  # a request holds a block only while it can hold a row
        width = padded_rows(spec.rows)
        drafter = drafter_for(self.model, spec.drafts) if spec.drafts is not None else None
        self.drafter = drafter
        if isinstance(self.inner, CpuBackend):
            if spec.trace:
                raise ValueError("the cpu backend has no traces: open the mirror with trace=False")
            cpu = CpuDecoder(self.model, width, blocks, self.sampling, drafter)
            self.context = cpu
            return built(CpuServingMirror, spec.overrides)(spec, cpu)
        from ..impl.tt_backend import TtBackend, TtMirror

        if not isinstance(self.inner, TtBackend):
            raise ValueError(f"cannot serve models on backend {self.inner.name!r}")
        device = self.inner.open_device()
        build = decoder_for(self.inner.device_kind())
        lanes = 1 + (spec.drafts.k if spec.drafts is not None else 0)
        decoder = build(device, self.model, width, blocks, self.sampling,
                        **({"drafter": drafter, "lanes": lanes} if drafter is not None else {}))
        self.context = decoder
        readback_cq = self.inner.readback_cq
        if readback_cq is None:
            readback_cq = 1 if getattr(device, "num_command_queues", 1) >= 2 else 0
        return built(TtMirror, spec.overrides)(device, spec, readback_cq, model=decoder)

    def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            closer()

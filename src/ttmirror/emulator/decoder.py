"""The serving engine's forward on the emulated device: the decoder step as a device op, the
sampler into the slot. The serving engine gets it through its entry point group
``ttmirror.serving.decoders`` (name "emulated", `ttmirror.serving.decoders`), never by import.

    stage(rows)                      copy_host_to_device_tensor of the step's context inputs (CQ0)
    forward(input_ids, positions, slot), all on CQ0, greedy:
      decoder_forward                history (the KV blocks) updated, logits [1, 1, V, W] float32
                                     ROW_MAJOR, one column per row
      argmax(logits, dim=2, keepdim=True, output_tensor=slot)          slot [1, 1, 1, W] uint32
    or seeded:
      decoder_forward                logits [1, 1, W, Vp] float32 TILE, one row per row
      typecast(logits -> values)     bfloat16 TILE (typecast keeps shape and layout)
      sampling(values, indices, k, p, temp, seed, output_tensor=slot)
    then, when the ring has a logprob part (`MirrorSpec.logprobs` n > 0):
      sampled_logprobs               log-softmax of the logits, the sampled id's logprob and the
                                     top n, into the slot's logprob part (read back with the ids)

With drafts (spec rule 13) the mirror's launch (`impl/tt_verify.py`) calls, for each lane j in
0..K, `lane(j, ...)`: decoder_lane (the decoder op on lane j, `context.decode_lane`), then the
same sampler into the slot's token of that lane (seeded: keyed by (request, the lane's
position)) and its logprobs into that lane's logprob part; after the verification's ttnn ops,
`propose(newest, position, drafts)`: draft_forward, the drafter model's K greedy proposals from
the accepted context (`context.draft_rows`) into the slot's draft part.

Every ttnn call is one the installed ttnn documents (`support.py`): argmax over
dimension rank-2 writes UINT32 ROW_MAJOR; `sampling` takes bfloat16 TILE values whose last
dimension Vp is a power-of-2 multiple of 32, so the vocabulary is padded to Vp with -inf logits
(never drawn) and index 0.

The decoder op's numerics are `serving.context.decode_rows` (a torch function over the model):
on the emulated device it is a program on the command queue like any ttnn op, reading and writing
DRAM when the queue reaches it, so it is ordered by the queue, visible to the hazard checks, and
traceable; `sampled_logprobs` is a program of the same kind. No ttnn kernel computes a
`transformers` model, so on a chip this op does not exist:
there the TT model stacks' own decode would take its place (not shipped: never run here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import ttnn

from ..impl.devices import ttnn_for
from ..impl.ring import LogprobSlot
from ..serving.context import (
    BAD_WORD_IDS,
    BAD_WORDS,
    BANNED,
    NO_ROWS,
    PARAMS,
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
from ..serving.models import DecoderModel
from .commands import Kernel, Program, register_kernel
from .device import EmulatedMeshDevice


def _allocate(device: Any, shape: list[int], dtype: ttnn.DataType) -> ttnn.Tensor:
    tt = ttnn_for(device)
    return tt.allocate_tensor_on_device(ttnn.Shape(shape), dtype, ttnn.ROW_MAJOR_LAYOUT, device)


def _host(values: torch.Tensor, dtype: ttnn.DataType) -> ttnn.Tensor:
    return ttnn.from_torch(values, dtype=dtype, layout=ttnn.ROW_MAJOR_LAYOUT)  # host only


def _ids(values: tuple[int, ...] | list[int], width: int) -> torch.Tensor:
    row = torch.zeros(1, width, dtype=torch.int32)
    if values:
        row[0, : len(values)] = torch.tensor(values, dtype=torch.int32)
    return row


def _sampling_key(k: torch.Tensor, p: torch.Tensor, inv_t: torch.Tensor) -> Hashable:
    return (tuple(k.tolist()), tuple(p.tolist()), tuple(inv_t.tolist()))


def padded_vocab(vocab: int) -> int:
    """The least power-of-2 multiple of 32 that holds `vocab`: what `sampling` takes."""
    tiles = 1
    while 32 * tiles < vocab:
        tiles *= 2
    return 32 * tiles


def dram_bytes(model: DecoderModel, width: int, blocks: int, lanes: int = 1) -> int:
    """DRAM the decoder's persistent tensors take (greedy logits f32; seeded logits f32, values
    bf16, indices i32 over the padded vocabulary; the context tables, the allowed ids per lane),
    to size an emulated device for large vocabularies."""
    padded = padded_vocab(model.vocab)
    logits = width * (model.vocab * 4 + padded * (4 + 2 + 4))
    constraints = width * (PARAMS + BANNED + (lanes + 1) * model.vocab
                           + BAD_WORDS * BAD_WORD_IDS) * 4
    return logits + (blocks + width) * model.max_context * 4 + constraints


@dataclass
class ComputeClock:
    """Seconds spent in the decoder's forward kernels: what a kernel's parameters may count."""

    seconds: float = 0.0


def _decoder_forward(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]
                     ) -> None:
    """The model forward: appends to the history (args[0], written in place), writes logits."""
    started = time.perf_counter()
    destination = outputs[0]
    model = params["model"]
    logits = decode_rows(model, args[0], *args[1:])  # [W, V]
    _write_logits(destination, logits, model.vocab, params["greedy"])
    params["clock"].seconds += time.perf_counter() - started


def _decoder_lane(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]
                  ) -> None:
    """Lane `params["lane"]` of a step with drafts: as `_decoder_forward`, over `decode_lane`
    (args: history, ids, positions, spec, then the context tables; the allowed ids of every
    lane, this lane's rows taken)."""
    started = time.perf_counter()
    destination = outputs[0]
    model, lane, width = params["model"], params["lane"], params["width"]
    history, ids, positions, spec, active, block, offset, prefill, prefill_ids, constraints, \
        banned, allowed, bias, bad = args
    logits = decode_lane(model, history, lane, spec, ids, positions, active, block, offset,
                         prefill, prefill_ids, constraints, banned,
                         allowed[lane * width:(lane + 1) * width], bias, bad)
    _write_logits(destination, logits, model.vocab, params["greedy"])
    params["clock"].seconds += time.perf_counter() - started


def _write_logits(destination: torch.Tensor, logits: torch.Tensor, vocab: int, greedy: bool
                  ) -> None:
    """[W, V] logits into the decoder's logits tensor: one column per row (greedy), or one padded
    row per row (seeded)."""
    if greedy:
        destination.copy_(logits.T.reshape(destination.shape))
    else:
        destination.fill_(float("-inf"))  # the padded vocabulary is never drawn
        destination[0, 0, :, :vocab] = logits


def _draft_forward(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]
                   ) -> None:
    """The drafter's K proposals after each row's newest token (args: history, newest,
    position, active, block, offset), one output per draft."""
    started = time.perf_counter()
    drafts = draft_rows(params["drafter"], args[0], len(outputs), *args[1:])
    for j, out in enumerate(outputs):
        out.copy_(drafts[j].reshape(out.shape).to(out.dtype))
    params["clock"].seconds += time.perf_counter() - started


def _sampled_logprobs(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]
                      ) -> None:
    logits, ids = args
    values_out, ids_out = outputs
    vocab, width = params["vocab"], params["width"]
    n = values_out.shape[-1] - 1
    # Greedy logits hold one column per row, seeded ones a padded row per row.
    if params["greedy"]:
        rows = logits.reshape(vocab, width).T
    else:
        rows = logits.reshape(width, -1)[:, :vocab]
    values, top = token_logprobs(rows, ids.reshape(-1), n)
    values_out.copy_(values.reshape(values_out.shape))
    ids_out.copy_(top.reshape(ids_out.shape).to(ids_out.dtype))


register_kernel("decoder_forward", _decoder_forward)
register_kernel("decoder_lane", _decoder_lane)
register_kernel("draft_forward", _draft_forward)
register_kernel("sampled_logprobs", _sampled_logprobs)


class DeviceDecoder:
    """Persistent context tensors (allocated at load), the decoder op and the sampler; with a
    `drafter`, also the lanes of a step with drafts and the drafter's op (`lane`, `propose`:
    the mirror's `LaneTarget` and `Drafter`)."""

    def __init__(
        self,
        device: Any,
        model: DecoderModel,
        width: int,
        blocks: int,
        sampling: SamplingParams,
        cq: int = 0,
        *,
        drafter: DecoderModel | None = None,
        lanes: int = 1,
    ) -> None:
        self.tt = ttnn_for(device)
        if not isinstance(device, EmulatedMeshDevice):
            raise NotImplementedError(
                f"the {model.name} forward runs as an emulated-device op; on a chip it needs the "
                "TT model stack's decode, which is not part of ttmirror (use the emulated device)"
            )
        self.device = device
        self.model = model
        self.width = width
        self.sampling = sampling
        self.cq = cq
        self.drafter = drafter
        self.lanes = lanes
        """1 + K: the query tokens a decoding row runs (the allowed ids are per lane)."""
        self._allocate_context(blocks)
        if not sampling.greedy:
            self._allocate_sampler()
        if not sampling.greedy:  # what _allocate_sampler wrote: the engine's, on every row
            self._written["sampling"] = _sampling_key(*row_sampling(NO_ROWS, sampling, width))
        self.forwards = 0
        self.clock = ComputeClock()
        """Seconds the emulated device spent computing forwards (kernels add to it)."""
        """Time the decoder op spent computing (its delay excluded), for calibration."""


    @property
    def compute_s(self) -> float:
        """Seconds the emulated device spent in this decoder's forwards."""
        return self.clock.seconds

    def _allocate_context(self, blocks: int) -> None:
        """The KV blocks (`history`), the per-row context inputs and the logits, zero-filled."""
        width, length, cq = self.width, self.model.max_context, self.cq
        self.history = _allocate(self.device, [blocks, length], ttnn.uint32)
        self.active, self.block, self.write_at, self.prefill, self.request = (
            _allocate(self.device, [1, width], ttnn.uint32) for _ in range(5)
        )
        self.prefill_ids = _allocate(self.device, [width, length], ttnn.uint32)
        # Per-row penalties and min_tokens (float32), the ids min_tokens masks, and the allowed
        # ids of constrained requests: written neutral here, then only when they change.
        self.params = _allocate(self.device, [width, PARAMS], ttnn.float32)
        self.banned = _allocate(self.device, [width, BANNED], ttnn.int32)
        self.allowed = _allocate(self.device, [self.lanes * width, self.model.vocab], ttnn.int32)
        # Logit biases and bad words (vLLM's logit_bias, bad_words), neutral until a row has one.
        self.bias = _allocate(self.device, [width, self.model.vocab], ttnn.float32)
        self.bad = _allocate(self.device, [width, BAD_WORDS * BAD_WORD_IDS], ttnn.int32)
        self._written: dict[str, Hashable] = {}
        self._stage_constraints(NO_ROWS)
        if self.sampling.greedy:  # one column per row: argmax over dimension 2 gives the slot
            self.logits = _allocate(self.device, [1, 1, self.model.vocab, width], ttnn.float32)
        else:  # one row per row, padded: what typecast and sampling take
            self.logits = self.tt.allocate_tensor_on_device(
                ttnn.Shape([1, 1, width, padded_vocab(self.model.vocab)]),
                ttnn.float32,
                ttnn.TILE_LAYOUT,
                self.device,
            )
        for tensor, shape in (
            (self.history, (blocks, length)),
            (self.prefill_ids, (width, length)),
            *((t, (1, width)) for t in (self.active, self.block, self.write_at, self.prefill)),
            (self.request, (1, width)),
        ):
            # Zero-filled: no op ever reads uninitialised DRAM as a block index or token.
            self.tt.copy_host_to_device_tensor(
                _host(torch.zeros(shape, dtype=torch.int32), ttnn.uint32), tensor, cq_id=cq
            )

    def _allocate_sampler(self) -> None:
        """The seeded sampler's persistent inputs: bf16 values, vocabulary indices, k, p, 1/T."""
        width, vocab, cq, sampling = self.width, self.model.vocab, self.cq, self.sampling
        padded = padded_vocab(vocab)
        self.values = self.tt.allocate_tensor_on_device(
            ttnn.Shape([1, 1, width, padded]), ttnn.bfloat16, ttnn.TILE_LAYOUT, self.device
        )
        indices = torch.zeros(padded, dtype=torch.int32)
        indices[:vocab] = torch.arange(vocab, dtype=torch.int32)
        self.indices = self.tt.from_torch(
            indices.repeat(width, 1).reshape(1, 1, width, padded),
            dtype=ttnn.int32,
            layout=ttnn.ROW_MAJOR_LAYOUT,
            device=self.device,
            cq_id=cq,
        )
        self.k = self.tt.from_torch(
            torch.full((width,), sampling.top_k, dtype=torch.int32),
            dtype=ttnn.uint32,
            layout=ttnn.ROW_MAJOR_LAYOUT,
            device=self.device,
            cq_id=cq,
        )
        self.p, self.temp = (
            self.tt.from_torch(
                torch.full((width,), value, dtype=torch.bfloat16),
                dtype=ttnn.bfloat16,
                layout=ttnn.ROW_MAJOR_LAYOUT,
                device=self.device,
                cq_id=cq,
            )
            for value in (sampling.top_p, 1.0 / sampling.temperature)
        )

    def stage(self, rows: StepContext) -> None:
        """Host writes of the step's context inputs, in queue order before its forward."""
        w = self.width
        for values, target in (
            (rows.active, self.active),
            (rows.block, self.block),
            (rows.write_at, self.write_at),
            (rows.prefill, self.prefill),
            (rows.request, self.request),
        ):
            self.tt.copy_host_to_device_tensor(_host(_ids(values, w), ttnn.uint32), target, cq_id=0)
        if rows.any_prefill():  # steady decode: nothing of the context comes from the host
            table = torch.zeros(w, self.model.max_context, dtype=torch.int32)
            for i, ids in enumerate(rows.prefill_ids):
                if ids:
                    table[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
            self.tt.copy_host_to_device_tensor(_host(table, ttnn.uint32), self.prefill_ids, cq_id=0)
        if not self.sampling.greedy:
            k, p, inv_t = row_sampling(rows, self.sampling, w)
            self._write_when_changed("sampling", _sampling_key(k, p, inv_t), lambda: [
                (k.to(torch.int32), ttnn.uint32, self.k),
                (p.to(torch.bfloat16), ttnn.bfloat16, self.p),
                (inv_t.to(torch.bfloat16), ttnn.bfloat16, self.temp),
            ])
        self._stage_constraints(rows)

    def _stage_constraints(self, rows: StepContext) -> None:
        """Penalties, min_tokens' banned ids and grammar masks of the step's rows."""
        params, banned = constraint_tables(rows, self.width)
        self._write_when_changed(
            "constraints", (tuple(params.flatten().tolist()), tuple(banned.flatten().tolist())),
            lambda: [(params, ttnn.float32, self.params), (banned, ttnn.int32, self.banned)])
        # Keyed by the constrained rows alone: a step of free rows builds no [width, V] table.
        masks = tuple((j, i, ids) for j in range(self.lanes)
                      for i, ids in enumerate(rows.allowed_at(j)) if ids is not None)
        self._write_when_changed("allowed", masks, lambda: [
            (allowed_table(rows, self.width, self.model.vocab, self.lanes), ttnn.int32,
             self.allowed)])
        self._write_when_changed("bias", (rows.biases, rows.bad_words), lambda: [
            (table, dtype, target) for table, dtype, target in zip(
                bias_tables(rows, self.width, self.model.vocab, flat=True),
                (ttnn.float32, ttnn.int32), (self.bias, self.bad), strict=True)])

    def _write_when_changed(
        self, name: str, key: Hashable,
        build: Callable[[], list[tuple[torch.Tensor, ttnn.DataType, ttnn.Tensor]]],
    ) -> None:
        """Write `build()`'s host tables into their device tensors, unless `key` is what was last
        written under `name` (steady decode with one layout writes nothing)."""
        if name in self._written and self._written[name] == key:
            return
        self._written[name] = key
        for values, dtype, target in build():
            self.tt.copy_host_to_device_tensor(_host(values, dtype), target, cq_id=self.cq)

    def forward(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor, slot: ttnn.Tensor,
                logprobs: LogprobSlot | None = None) -> None:
        """Enqueue the decoder op and the sampler; the sampler writes straight into `slot`, and
        the logprobs of what it drew go to the slot's logprob part when there is one."""
        self._enqueue_decoder(input_ids, positions)
        self._sample(positions, slot, logprobs)
        self.forwards += 1

    def lane(self, j: int, input_ids: ttnn.Tensor, positions: ttnn.Tensor, spec: ttnn.Tensor,
             out: ttnn.Tensor, logprobs: LogprobSlot | None = None) -> None:
        """Lane j of a step with drafts (`tt_verify.LaneTarget`): the decoder op on the lane's
        ids at its positions, then the sampler into `out` and the logprobs into `logprobs`."""
        self._enqueue_decoder(input_ids, positions, lane=j, spec=spec)
        self._sample(positions, out, logprobs)
        self.forwards += j == 0

    def propose(self, newest: ttnn.Tensor, position: ttnn.Tensor,
                out: Sequence[ttnn.Tensor]) -> None:
        """The drafter's K proposals after each row's newest token (`tt_verify.Drafter`)."""
        if self.drafter is None:
            raise RuntimeError("this decoder was loaded without a drafter")
        reads = (self.history, newest, position, self.active, self.block, self.write_at)
        kernel = Kernel("draft_forward", tuple(t.operand for t in reads),
                        tuple(t.operand for t in out),
                        {"drafter": self.drafter, "clock": self.clock})
        program = Program("draft_forward", reads=tuple(t.buffer for t in reads),
                          writes=tuple(t.buffer for t in out), kernel=kernel,
                          cache_key=("draft_forward", id(self)))
        self.device.launch(program, self.cq)

    def _sample(self, positions: ttnn.Tensor, slot: ttnn.Tensor,
                logprobs: LogprobSlot | None) -> None:
        """The sampler from the logits into `slot` (seeded: keyed by each row's request and
        `positions`), then the logprobs of what it drew."""
        with self.tt.command_queue(self.cq):
            if self.sampling.greedy:
                self.tt.argmax(self.logits, dim=2, keepdim=True, output_tensor=slot)
            else:
                self.device.bind_sampling_identity(self.request, positions)
                self.tt.typecast(self.logits, ttnn.bfloat16, output_tensor=self.values)
                self.tt.sampling(
                    self.values,
                    self.indices,
                    self.k,
                    self.p,
                    self.temp,
                    seed=int(self.sampling.seed or 0),
                    output_tensor=slot,
                )
        if logprobs is not None:
            self._enqueue_logprobs(slot, logprobs)

    def _enqueue_logprobs(self, slot: ttnn.Tensor, part: LogprobSlot) -> None:
        """The sampled id's logprob and the top n, from this step's logits, into `part`."""
        kernel = Kernel(
            "sampled_logprobs",
            (self.logits.operand, slot.operand),
            (part.values.operand, part.ids.operand),
            {"vocab": self.model.vocab, "width": self.width, "greedy": self.sampling.greedy},
        )
        program = Program(
            "sampled_logprobs",
            reads=(self.logits.buffer, slot.buffer),
            writes=(part.values.buffer, part.ids.buffer),
            kernel=kernel,
            cache_key=("sampled_logprobs", id(self)),
        )
        self.device.launch(program, self.cq)

    def _enqueue_decoder(self, input_ids: ttnn.Tensor, positions: ttnn.Tensor,
                         lane: int | None = None, spec: ttnn.Tensor | None = None) -> None:
        """The decoder op (`lane` None), or its lane `lane` of a step with drafts (reading each
        row's scheduled drafts, `spec`)."""
        inputs = [
            input_ids,
            positions,
            *([] if spec is None else [spec]),
            self.active,
            self.block,
            self.write_at,
            self.prefill,
            self.prefill_ids,
            self.params,
            self.banned,
            self.allowed,
            self.bias,
            self.bad,
        ]
        # Operands at fixed addresses, as every emulated op: a trace replays the same bytes.
        name = "decoder_forward" if lane is None else "decoder_lane"
        kernel = Kernel(
            name,
            (self.history.operand, *(t.operand for t in inputs)),
            (self.logits.operand,),
            {"model": self.model, "greedy": self.sampling.greedy, "clock": self.clock,
             **({} if lane is None else {"lane": lane, "width": self.width})},
        )
        program = Program(
            name,
            reads=tuple(t.buffer for t in (*inputs, self.history)),
            writes=(self.history.buffer, self.logits.buffer),
            kernel=kernel,
            cache_key=(name, id(self), lane),
        )
        self.device.launch(program, self.cq)

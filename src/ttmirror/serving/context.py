"""Per-row context of a serving step and the decoder step's numerics (shared by tt and cpu).

Each request that holds a KV block owns one row of the `history` table ([blocks, max_context]
token ids): it is the recompute form of a KV cache, and it lives on the device. A step's row i

    1. prefill rows only: history[block, :at] = prefill_ids[i, :at]   (host's authoritative tokens)
    2. history[block, at] = input_ids[i]          (the combined id: host's, or the mirror's)
    3. logits[i] = model.logits(history[block, :at + 1], pos[i])

so in steady decode the newest token reaches the context from the device only; the host rewrites
a block from its own token list only when a request (re)enters: on arrival and after preemption,
when the device row it had is no longer its.

With drafts (spec rule 13) a step runs 1 + spec query tokens per row, lane j being the newest
token (j = 0) or draft j at position pos + j (`decode_lane`): lane j writes history[block, at + j]
and reads the context through it, so the target sees each draft after the ones before it. A row
reading the mirror has its position on the device only, so the index is the row's offset (where
position 0 goes) plus the lane's position, computed there. A rejected draft's entry is dead: the
next step's newest token overwrites the first of them, and nothing reads past a context's end.
After verification the drafter proposes K tokens from the accepted context (`draft_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import torch

from ..impl.rows import Row
from .models import DecoderModel

UINT32_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """Greedy (`seed is None`) or seeded top-k/top-p sampling. The engine's setting picks the
    decoder's path at load (argmax, or the device sampler); on the sampler path each request may
    carry its own top-k, top-p, temperature and seed, and a greedy request draws with top-k 1.
    A request's own seed keys its draws by (seed, position) alone (`draw_key`), so the same
    prompt and seed give the same tokens whatever the request's id, row or batch."""

    seed: int | None = None
    top_k: int = 8
    top_p: float = 0.9
    temperature: float = 1.0
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every id the request has generated (as vLLM)."""
    frequency_penalty: float = 0.0
    """Subtracted from an id's logit once per time the request generated it."""
    repetition_penalty: float = 1.0
    """Ids in the prompt or the output: a positive logit is divided by it, a negative one
    multiplied."""
    min_tokens: int = 0
    """Its stop ids are masked out until it has generated this many tokens."""
    logprobs: int | None = None
    """Return, with each token, its logprob and the top `logprobs` (id, logprob) pairs (vLLM's
    `logprobs`); None: none. From the logprob ring, read back under the ids' event."""
    min_p: float = 0.0
    """Ids whose probability (after temperature) is below min_p times the most likely one's
    are masked (vLLM's `min_p`); a greedy draw is unchanged by it."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(id, bias) pairs added to the logits before anything else (vLLM's `logit_bias`)."""
    allowed_ids: frozenset[int] | None = None
    """Only these ids may be drawn (vLLM's `allowed_token_ids`); None: every id."""
    bad_words: tuple[tuple[int, ...], ...] = ()
    """Token sequences never to complete (vLLM's `bad_words`, as ids): the last id of each is
    masked when the tokens generated so far end with the ones before it."""

    def constrained(self) -> bool:
        """Any penalty, min_tokens, min_p, bias or mask: the decoder op applies them on the
        device."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1 or self.min_tokens > 0 or self.min_p > 0
                or bool(self.logit_bias) or self.allowed_ids is not None
                or bool(self.bad_words))

    @property
    def greedy(self) -> bool:
        return self.seed is None

    def describe(self) -> str:
        base = ("greedy" if self.greedy else
                f"seeded(seed={self.seed}, k={self.top_k}, p={self.top_p}, T={self.temperature})")
        if self.logprobs is not None:
            base += f" + logprobs({self.logprobs})"
        if not self.constrained():
            return base
        extra = "".join(f", {name}={value!r}" for name, value in (
            ("min_p", self.min_p), ("logit_bias", dict(self.logit_bias)),
            ("allowed_ids", None if self.allowed_ids is None else sorted(self.allowed_ids)),
            ("bad_words", [list(w) for w in self.bad_words])) if value)
        return (f"{base} + penalties(presence={self.presence_penalty}, "
                f"frequency={self.frequency_penalty}, repetition={self.repetition_penalty}, "
                f"min_tokens={self.min_tokens}{extra})")


class ContextRow(NamedTuple):
    """One row of a step as the serving engine stages it: the runner's row record and what the
    engine adds to it for the decoder op."""

    row: Row
    """The runner's record: request, position, live, partial."""
    block: int
    """The KV block (row of `history`) its request holds."""
    write_at: int
    """Index in the context where the row's input id goes (prompt length - 1 + pos). With drafts,
    the index of position 0 instead (the offset): the decoder op adds each lane's position,
    which for a row reading the mirror only the device knows."""
    prefill: tuple[int, ...] | None
    """The context before `write_at`, from the host's token list, when the row (re)enters its
    block (arrival, resume); None: it decodes from the block as the device holds it."""
    key: int
    """Its draw key (`draw_key`): seeded sampling draws by (engine seed, key, position)."""
    sampling: SamplingParams
    """Its request's own parameters, else the engine's."""
    banned: tuple[int, ...] = ()
    """The ids masked while it has generated fewer than min_tokens (its stop ids)."""
    allowed: frozenset[int] | None = None
    """The ids its grammar allows next (built on the host), or None: every id."""
    draft_allowed: tuple[frozenset[int], ...] = ()
    """With drafts, the ids its grammar allows after each of its host drafts (lanes 1..spec)."""


@dataclass(frozen=True)
class StepContext:
    """The host's part of one step's context: its rows, and the per-row tables the decoder op
    reads, derived from them (unused rows: inactive)."""

    rows: tuple[ContextRow, ...] = ()

    @cached_property
    def active(self) -> tuple[int, ...]:
        return tuple(int(r.row.live) for r in self.rows)

    @cached_property
    def block(self) -> tuple[int, ...]:
        return tuple(r.block for r in self.rows)

    @cached_property
    def write_at(self) -> tuple[int, ...]:
        return tuple(r.write_at for r in self.rows)

    @cached_property
    def prefill(self) -> tuple[int, ...]:
        return tuple(int(r.prefill is not None) for r in self.rows)

    @cached_property
    def prefill_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple(r.prefill or () for r in self.rows)

    @cached_property
    def request(self) -> tuple[int, ...]:
        return tuple(r.key for r in self.rows)

    # On the sampler path a greedy request draws its single most likely id: top-k 1.
    @cached_property
    def top_k(self) -> tuple[int, ...]:
        return tuple(1 if r.sampling.greedy else r.sampling.top_k for r in self.rows)

    @cached_property
    def top_p(self) -> tuple[float, ...]:
        return tuple(1.0 if r.sampling.greedy else r.sampling.top_p for r in self.rows)

    @cached_property
    def temperature(self) -> tuple[float, ...]:
        return tuple(1.0 if r.sampling.greedy else r.sampling.temperature for r in self.rows)

    @cached_property
    def constraints(self) -> tuple[tuple[float, ...], ...]:
        """Per row: (presence, frequency, repetition, min_tokens, min_p, temperature)."""
        return tuple((r.sampling.presence_penalty, r.sampling.frequency_penalty,
                      r.sampling.repetition_penalty, float(r.sampling.min_tokens),
                      r.sampling.min_p, t) for r, t in zip(self.rows, self.temperature,
                                                           strict=True))

    @cached_property
    def biases(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        return tuple(r.sampling.logit_bias for r in self.rows)

    @cached_property
    def bad_words(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return tuple(r.sampling.bad_words for r in self.rows)

    @cached_property
    def banned(self) -> tuple[tuple[int, ...], ...]:
        return tuple(r.banned for r in self.rows)

    @cached_property
    def allowed(self) -> tuple[frozenset[int] | None, ...]:
        return self.allowed_at(0)

    def allowed_at(self, lane: int) -> tuple[frozenset[int] | None, ...]:
        """Per row, the ids its grammar allows on `lane` (0: the newest token's next)."""
        return tuple(r.allowed if lane == 0 else
                     (r.draft_allowed[lane - 1] if lane <= len(r.draft_allowed) else None)
                     for r in self.rows)

    def any_prefill(self) -> bool:
        return any(r.prefill is not None for r in self.rows)


REQUEST_IDS = 1 << 30
"""Request ids are below this; draw keys at or above it stand for a request's own seed (both
fit the device's int32-staged uint32 column without wrapping)."""


def draw_key(req: int, own: SamplingParams | None) -> int:
    """What a row's seeded draw is keyed by, with its position: the request's id, or, for a
    request with its own seed, a 30-bit mix of that seed (its ids never collide with a seed's)."""
    if own is None or own.seed is None:
        return req
    x = (own.seed * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    return REQUEST_IDS | ((x ^ (x >> 29)) & (REQUEST_IDS - 1))


NO_ROWS = StepContext()
"""A step with no rows staged: every per-row table at its neutral (the engine's) value."""


def row_sampling(
    rows: StepContext, default: SamplingParams, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: top-k, top-p and 1/temperature for the sampler (the engine's where unstaged)."""
    k = torch.full((width,), default.top_k, dtype=torch.int32)
    p = torch.full((width,), default.top_p, dtype=torch.float32)
    inv_t = torch.full((width,), 1.0 / default.temperature, dtype=torch.float32)
    for i, (rk, rp, rt) in enumerate(zip(rows.top_k, rows.top_p, rows.temperature, strict=True)):
        k[i], p[i], inv_t[i] = rk, rp, 1.0 / rt
    return k, p, inv_t


BANNED = 64
"""Stop ids per row that min_tokens can mask (the device table's width)."""
BAD_WORDS, BAD_WORD_IDS = 16, 8
"""Bad words per row, and ids per bad word, the device's bad-words table holds."""
PARAMS = 6
"""Columns of the parameter table: presence, frequency, repetition, min_tokens, min_p, T."""
NEUTRAL = (0.0, 0.0, 1.0, 0.0, 0.0, 1.0)


def constraint_tables(rows: StepContext, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-row constraint tables the decoder op reads: [width, PARAMS] float32 parameters
    (presence, frequency, repetition, min_tokens, min_p, temperature; neutral on unstaged rows)
    and [width, BANNED] int32 banned ids (-1 = none)."""
    params = torch.tensor([NEUTRAL] * width, dtype=torch.float32)
    banned = torch.full((width, BANNED), -1, dtype=torch.int32)
    for i, c in enumerate(rows.constraints):
        params[i] = torch.tensor(c, dtype=torch.float32)
    for i, ids in enumerate(rows.banned):
        if len(ids) > BANNED:
            raise ValueError(f"row {i}: {len(ids)} stop ids, the device table holds {BANNED}")
        if ids:
            banned[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return params, banned


def bias_tables(rows: StepContext, width: int, vocab: int, flat: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-row logit biases, [width, vocab] float32 (0: none), and bad words, [width,
    BAD_WORDS, BAD_WORD_IDS] int32 (each word's ids right-aligned, -1 before them and in unused
    words; `flat`: [width, BAD_WORDS * BAD_WORD_IDS], the device tensor's shape), that the
    decoder op reads."""
    bias = torch.zeros(width, vocab, dtype=torch.float32)
    bad = torch.full((width, BAD_WORDS, BAD_WORD_IDS), -1, dtype=torch.int32)
    for i, pairs in enumerate(rows.biases):
        for token, value in pairs:
            bias[i, token] += value
    for i, words in enumerate(rows.bad_words):
        if len(words) > BAD_WORDS or any(len(w) > BAD_WORD_IDS for w in words):
            raise ValueError(f"row {i}: the device table holds {BAD_WORDS} bad words of at "
                             f"most {BAD_WORD_IDS} ids")
        for j, word in enumerate(words):
            bad[i, j, BAD_WORD_IDS - len(word):] = torch.tensor(word, dtype=torch.int32)
    return bias, bad.reshape(width, -1) if flat else bad


def _bad_ids(bad: torch.Tensor, generated: torch.Tensor) -> list[int]:
    """The ids one row's bad words mask now: each word's last id where the tokens generated so
    far end with the word's other ids."""
    out = []
    for word in bad.reshape(BAD_WORDS, BAD_WORD_IDS).tolist():
        ids = [t for t in word if t >= 0]
        if not ids:
            continue
        before = ids[:-1]
        if not before or (len(generated) >= len(before)
                          and generated[len(generated) - len(before):].tolist() == before):
            out.append(ids[-1])
    return out


def constrain(logits: torch.Tensor, context: torch.Tensor, generated: int,
              params: Sequence[float], banned: torch.Tensor, bias: torch.Tensor | None = None,
              bad: torch.Tensor | None = None) -> torch.Tensor:
    """One row's logits after, in vLLM's order, its logit bias, penalties, the min_tokens and
    bad-words masks and min_p, from the context on the device (`generated`: the row's position,
    the tokens it has generated, the newest included; `params` the row of the parameter
    table; `bias` and `bad` the row's rows of `bias_tables`, None where it has none)."""
    presence, frequency, repetition, min_tokens, min_p, temperature = (float(x) for x in params)
    if repetition == 1.0 and not (generated and (presence or frequency)) and (
            generated >= min_tokens) and not min_p and bias is None and bad is None:
        return logits  # neutral: nothing to apply (most rows, most steps)
    out = logits.clone()
    if bias is not None:
        out += bias[: out.numel()]
    vocab = out.numel()
    seen = context.clamp(0, vocab - 1)
    if repetition != 1.0:
        hit = torch.zeros(vocab, dtype=torch.bool)
        hit[seen] = True
        out[hit] = torch.where(out[hit] > 0, out[hit] / repetition, out[hit] * repetition)
    if generated and (presence or frequency):
        counts = torch.bincount(seen[-generated:], minlength=vocab).to(out.dtype)
        out -= frequency * counts + presence * (counts > 0).to(out.dtype)
    if generated < min_tokens:
        ids = banned[banned >= 0].to(torch.int64)
        out[ids[ids < vocab]] = float("-inf")
    if bad is not None:
        masked = [t for t in _bad_ids(bad, context[len(context) - generated:]) if t < vocab]
        out[masked] = float("-inf")
    if min_p > 0:  # p < min_p * p_max after temperature: logit < max + T * ln(min_p)
        out[out < out.max() + temperature * math.log(min_p)] = float("-inf")
    return out


def allowed_table(rows: StepContext, width: int, vocab: int, lanes: int = 1) -> torch.Tensor:
    """[lanes * width, vocab] int32: 1 where a row's next token on a lane may be the id (all 1
    on free rows); lane j's rows at j * width."""
    table = torch.ones(lanes * width, vocab, dtype=torch.int32)
    for lane in range(lanes):
        for i, ids in enumerate(rows.allowed_at(lane)):
            if ids is not None:
                table[lane * width + i] = 0
                table[lane * width + i, sorted(ids)] = 1
    return table


def token_logprobs(
    logits: torch.Tensor, sampled: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprob ring's content for one step: from [rows, V] float32 logits (the decoder op's,
    penalties and masks applied, before temperature, top-k and top-p) and each row's sampled id,
    [rows, 1 + n] float32 (the sampled id's logprob, then the top n) and [rows, n] int32 ids.
    The top n are most likely first, ties to the lower id. An id outside the vocabulary (an
    unused row's garbage) is clamped, as the decoder op clamps its inputs."""
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    vocab = logprobs.shape[-1]
    ids = (sampled.reshape(-1).to(torch.int64) & UINT32_MASK).clamp(max=vocab - 1)
    chosen = logprobs.gather(1, ids.reshape(-1, 1))
    order = torch.sort(logprobs, dim=-1, descending=True, stable=True).indices[:, :n]
    values = torch.cat([chosen, logprobs.gather(1, order)], dim=1)
    return values, order.to(torch.int32)


def decode_rows(
    model: DecoderModel,
    history: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    active: torch.Tensor,
    block: torch.Tensor,
    write_at: torch.Tensor,
    prefill: torch.Tensor,
    prefill_ids: torch.Tensor,
    params: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    bad: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply one step to `history` in place and return [rows, V] float32 logits, masked per row
    by the `allowed` ids, then biased, penalised and masked by `params`, `banned`
    (`constraint_tables`), `bias` and `bad` (`bias_tables`) when given.

    Ids arrive as device integers: a -1 placeholder wraps to 2**32 - 1 and is clamped to the last
    vocabulary id (a wrong token, as on a device, not a crash).
    """
    rows = input_ids.numel()
    logits = torch.zeros(rows, model.vocab, dtype=torch.float32)
    ids = (input_ids.reshape(-1).to(torch.int64) & UINT32_MASK).clamp(max=model.vocab - 1)
    # Each per-row table as Python numbers once: an element read is a torch call per row.
    flags, blocks, ats, prefills, poss, news = (
        t.reshape(-1).tolist() for t in (active, block, write_at, prefill, positions, ids))
    param_rows = params.tolist() if params is not None else None
    # Which rows have a bias or bad words: one reduction per table, not one per row.
    biased = bias.reshape(bias.shape[0], -1).any(dim=1).tolist() if bias is not None else None
    worded = (bad.reshape(bad.shape[0], -1) >= 0).any(dim=1).tolist() if bad is not None \
        else None
    for i in range(rows):
        if not flags[i]:
            continue
        b, at = int(blocks[i]), int(ats[i])
        if prefills[i]:
            history[b, :at] = prefill_ids[i, :at].to(history.dtype)
        history[b, at] = news[i]
        context = history[b, : at + 1].to(torch.int64)
        pos = int(poss[i])
        logits[i] = model.logits(context, pos)
        if allowed is not None:  # first: min_p then weighs only what may be drawn
            logits[i][allowed[i] == 0] = float("-inf")
        if param_rows is not None and banned is not None:
            logits[i] = constrain(logits[i], context, pos, param_rows[i], banned[i],
                                  bias[i] if bias is not None and biased and biased[i] else None,
                                  bad[i] if bad is not None and worded and worded[i] else None)
    return logits


def decode_lane(model: DecoderModel, history: torch.Tensor, lane: int, spec: torch.Tensor,
                input_ids: torch.Tensor, positions: torch.Tensor, active: torch.Tensor,
                block: torch.Tensor, offset: torch.Tensor, prefill: torch.Tensor,
                *rest: Any) -> torch.Tensor:
    """Lane `lane` of a step with drafts: `decode_rows` over the rows that scheduled at least
    `lane` drafts, each writing its lane's id at `offset + position` (the lane's positions, as
    the device holds them) and reading its context through it; a row prefills on lane 0 only.
    `rest`: `decode_rows`'s prefill ids and constraint tables (the allowed ids: this lane's). A
    position past the context (never a delivered token's) computes nothing."""
    width = active.numel()

    def column(t: torch.Tensor) -> torch.Tensor:  # device integers as int64, uint32 unwrapped
        return t.reshape(-1)[:width].to(torch.int64) & UINT32_MASK

    at = column(offset) + column(positions)
    live = (column(active) > 0) & (column(spec) >= lane) & (at < model.max_context)
    first = prefill if lane == 0 else torch.zeros_like(prefill)  # a row prefills on lane 0
    return decode_rows(model, history, input_ids, positions, live.to(torch.int64), block,
                       torch.where(live, at, 0), first, *rest)


def draft_rows(
    drafter: DecoderModel,
    history: torch.Tensor,
    k: int,
    newest: torch.Tensor,
    position: torch.Tensor,
    active: torch.Tensor,
    block: torch.Tensor,
    offset: torch.Tensor,
) -> torch.Tensor:
    """[k, rows] int64: each active row's K drafts after its newest token at `position` (where
    verification advanced it), greedy from the drafter over the accepted context: the block's
    tokens before that position, then the newest, then the drafts so far. The drafter writes no
    KV of its own (the next step's lanes write the target's)."""
    width = active.numel()
    out = torch.zeros(k, width, dtype=torch.int64)
    news = ((newest.reshape(-1)[:width].to(torch.int64) & UINT32_MASK)
            .clamp(max=drafter.vocab - 1)).tolist()
    flags, blocks, offsets, poss = (t.reshape(-1)[:width].tolist()
                                    for t in (active, block, offset, position))
    for i in range(width):
        at = int(offsets[i]) + (int(poss[i]) & UINT32_MASK)
        if not flags[i] or at + k > drafter.max_context:
            continue  # no row, or drafts past the context: never used
        context = torch.cat([history[int(blocks[i]), :at].to(torch.int64),
                             torch.tensor([news[i]])])
        for j in range(k):
            token = int(torch.argmax(drafter.logits(context, int(poss[i]) + j)))
            out[j, i] = token
            context = torch.cat([context, torch.tensor([token])])
    return out

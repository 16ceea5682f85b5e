"""Continuous batching over the runner: prompts, a KV budget that preempts, device-resident context.

`ServingEngine` is the engine (`engine.py`: depth 1 or 2 from the resolved async setting, the
phases in pipeline order, stop tokens) plus what serving a decoder model needs:

- requests carry a whole prompt (ids checked against the vocabulary at submit, before anything
  is scheduled), max_tokens and stop ids;
- each admitted request holds one KV block (a device row of the context table) until it
  finishes, aborts or is preempted;
- a KV budget in tokens: before each step, if the contexts the step would grow exceed it, the
  newest-arrived running request is preempted (its block freed; its in-flight tokens delivered
  under the keep policy, the default, or dropped under drop);
  preempted requests resume first, when the budget allows, rebuilt from the host's token list;
- each step stages its rows' context inputs (block, write index, prefill) between the runner's
  schedule and combine.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..impl.backend import TokenLogprobs
from ..impl.drafts import DraftSpec
from ..impl.overrides import NONE, Overrides
from ..impl.probe import ProbeSpec
from ..impl.rows import Row
from ..impl.runner import CLOSED, PhaseError, Status
from .backend import ServingBackend
from .context import (
    BAD_WORD_IDS,
    BAD_WORDS,
    BANNED,
    REQUEST_IDS,
    ContextRow,
    SamplingParams,
    StepContext,
    draw_key,
)
from .engine import Engine, EngineConfig, Order, Watchdog
from .grammar import GRAMMARS
from .models import DecoderModel
from .row_order import row_order


class InvalidRequest(ValueError):
    """A request the engine refuses at submit: nothing of it was scheduled."""


@dataclass
class ServingConfig:
    async_scheduling: str = "auto"
    rows: int = 8
    slots: int = 2
    kv_tokens: int | None = None
    """KV budget in context tokens across admitted requests (None: no limit beyond rows)."""
    trace: bool = False
    guard: bool = True
    drain_on_layout_change: bool = False
    preempt_policy: str = "keep"
    """A preempted request's in-flight tokens: "keep" (vLLM's) or "drop" (recomputed)."""
    prefill_chunk: int | None = None
    """Most context tokens a step prefills per request (chunked prefill); None: no such limit.
    A partial chunk's sampled id is discarded; a resumed request's re-prefill is chunked too."""
    max_step_tokens: int | None = None
    """Tokens one step computes (vLLM's max_num_batched_tokens): a decoding row takes one, and
    the prefills share what the decodes leave, in arrival order, chunked to fit; None: no limit.
    At least `rows`, so every row of a step gets a token."""
    record_events: bool = True
    """The runner records its protocol events (`impl/events.py`), for trace validation."""
    readback_timeout_s: float | None = None
    """How long the host waits for a step's readback before it fails that step's requests
    (None: as long as it takes)."""
    max_logprobs: int = 0
    """Top logprobs a request may ask for (vLLM's max_logprobs); above 0 the runner allocates the
    logprob ring beside the ids' ring at load, and every step fills it."""
    overrides: Overrides = NONE
    """Decision overrides of the runner and its mirror (`impl/overrides.py`; the conformance
    suite plants its bugs so); none by default."""
    row_order: str = "by-id"
    """Where each request's row lands in a step (`row_order.POLICIES`): by id, reversed, a
    seeded shuffle per step, or vLLM's condense-on-removal. Tokens do not depend on it."""
    row_order_seed: int = 0
    """The seed of the `shuffle` policy."""
    subsets: bool = False
    """vLLM's scheduler freedoms (spec rule 14): a step may leave eligible requests out and
    carry fewer drafts on a row. With a foreign scheduler (`ScheduledEngine` sets it), whatever
    it planned; with this engine's own, vLLM's choices: under `max_step_tokens`, decoding rows
    first, each with as many of its drafts as the budget leaves, then the prefills, and what the
    budget cannot hold waits for a later step; and no more drafts than the model's context
    holds after the newest token. False: every eligible request, all its drafts, in every step
    (`max_step_tokens` must then hold every row's tokens)."""
    state: str = "ring"
    """Where the tokens the host does not know yet live on the device (spec rule 14): "ring" or
    "rows" (a state row per request, `EngineConfig.state`)."""
    spec_tokens: int = 0
    """Speculative decoding (spec rule 13): K = 1 or 2 drafts per decoding row, proposed on the
    device by the model's drafter (`models.drafter_for`) and verified there; 0: none. A decoding
    row then computes 1 + K tokens, which the step's token budget and the KV budget count."""


@dataclass
class _Request:
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int]
    arrival: int
    host_sync: bool = False
    sampling: SamplingParams | None = None
    """Its own sampling parameters (None: the engine's)."""
    constraint: str | None = None
    """The grammar its tokens follow (`grammar.GRAMMARS`), built on the host: host-sync."""


@dataclass
class KvStats:
    preemptions: int = 0
    resumes: int = 0
    peak_tokens: int = 0
    prefills: int = 0
    partial_chunks: int = 0
    """Partial prefill chunks staged (their sampled ids discarded)."""
    constrained_rows: int = 0
    """Rows whose allowed ids the host built from the request's grammar."""
    mixed_sampling_steps: int = 0
    """Steps whose rows sample with different parameters (greedy beside sampled, ...)."""
    chunks_beside_mirror: int = 0
    """Steps that prefilled a partial chunk beside a row decoding from the mirror."""
    budget_cut_chunks: int = 0
    """Prefill chunks the step's token budget cut shorter than they would have been."""
    peak_step_tokens: int = 0
    """Most tokens one step computed (decodes plus prefill chunks)."""
    left_out_rows: int = 0
    """Eligible requests this engine's scheduler left out of a step (its token budget: rule 14)."""
    budget_trimmed_drafts: int = 0
    """Drafts this engine's scheduler did not put on a row for its token budget (rule 14)."""
    context_trimmed_drafts: int = 0
    """Drafts this engine's scheduler did not put on a row for the model's context (rule 14)."""
    drafts_on_prefill: int = 0
    """Last prefill chunks a foreign scheduler gave drafts (left unverified: all rejected)."""
    prefix_hits: int = 0
    """(Re)entries whose scheduler had their first tokens cached (a foreign prefix cache)."""
    prefix_tokens: int = 0
    """Context tokens those entries did not compute again (the cached prefixes)."""
    preempted: set[int] = field(default_factory=set)
    resumed_at: dict[int, int] = field(default_factory=dict)
    """Tokens each resumed request had at its last resume."""


class ServingEngine(Engine):
    def __init__(
        self,
        backend: ServingBackend,
        config: ServingConfig | None = None,
        order: Order | None = None,
    ) -> None:
        self.model: DecoderModel = backend.model
        self.sampling: SamplingParams = backend.sampling
        self.serving = config or ServingConfig()
        c = self.serving
        if c.prefill_chunk is not None and c.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be 1 or more, got {c.prefill_chunk}")
        if c.spec_tokens not in (0, 1, 2):
            raise ValueError(f"spec_tokens must be 0, 1 or 2 (drafts per decoding row), got "
                             f"{c.spec_tokens}")
        self.k = c.spec_tokens
        if c.max_step_tokens is not None and c.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be 1 or more, got {c.max_step_tokens}")
        if (c.max_step_tokens is not None and not c.subsets
                and c.max_step_tokens < c.rows * (1 + self.k)):
            per_row = f" times 1 + spec_tokens ({1 + self.k})" if self.k else ""
            raise ValueError(f"max_step_tokens ({c.max_step_tokens}) must be at least rows "
                             f"({c.rows}){per_row}: every row of a step takes "
                             f"{'its tokens' if self.k else 'a token'} (or let the "
                             "scheduler leave rows out: subsets)")
        chosen = order or row_order(c.row_order, c.row_order_seed)  # ValueError if unknown
        if not 0 <= c.max_logprobs <= self.model.vocab:
            raise ValueError(f"max_logprobs must be in [0, {self.model.vocab}] (the vocabulary of "
                             f"{self.model.name}), got {c.max_logprobs}")
        super().__init__(
            backend,
            EngineConfig(
                async_scheduling=c.async_scheduling,
                rows=c.rows,
                slots=c.slots,
                # The runner checks ids and lengths against this range; the model is elsewhere.
                probe=ProbeSpec(vocab=self.model.vocab, max_positions=self.model.max_context),
                trace=c.trace,
                guard=c.guard,
                drain_on_layout_change=c.drain_on_layout_change,
                preempt_policy=c.preempt_policy,
                logprobs=c.max_logprobs,
                record_events=c.record_events,
                readback_timeout_s=c.readback_timeout_s,
                overrides=c.overrides,
                drafts=DraftSpec(k=self.k) if self.k else None,
                subsets=c.subsets,
                state=c.state,
            ),
            chosen,
        )
        assert backend.context is not None  # set when the runner allocated the mirror
        self.context = backend.context
        self.requests: Mapping[int, _Request] = self.runner.requests.entries
        """This engine's record of each request submitted (the request table's entries)."""
        self.block_of: dict[int, int] = {}
        self.prefilled: dict[int, int] = {}  # context tokens prefilled by partial chunks so far
        self.masks: dict[int, tuple[frozenset[int], ...]] = {}
        """This step's masks from a foreign scheduler, per request and lane (`Plan.masks`)."""
        self.chunk: dict[int, int] = {}  # this step's prefill chunk per prefilling request
        self.free_blocks = list(range(c.rows))
        self.needs_prefill: set[int] = set()
        self.kv = KvStats()
        self._planned: dict[int, int] = {}
        """This step's rows and the drafts each carries, as `_plan` chose them (rule 14)."""
        self._arrivals = 0

    # --- requests --------------------------------------------------------------------------------
    def submit(  # type: ignore[override]
        self,
        req: int,
        prompt: Sequence[int],
        *,
        max_tokens: int = 16,
        stop_ids: Iterable[int] = (),
        host_sync: bool = False,
        sampling: SamplingParams | None = None,
        constraint: str | None = None,
    ) -> None:
        """Queue a request; InvalidRequest (nothing queued) if the engine can never serve it.
        `host_sync`: its next step needs its newest token on the host (a host-side mask, as
        structured output needs), so it is not scheduled while a step of it is in flight.
        `sampling`: its own top-k, top-p and temperature (greedy: top-k 1), on an engine loaded
        with a seeded sampler. `constraint`: a grammar of `grammar.GRAMMARS` whose mask the host
        builds from the request's tokens, so the request is host-sync."""
        ids = self.validate(req, prompt, max_tokens)
        if constraint is not None and constraint not in GRAMMARS:
            raise InvalidRequest(f"request {req}: unknown constraint {constraint!r}; choose one "
                                 f"of: {', '.join(GRAMMARS)}")
        stops = frozenset(stop_ids)
        if sampling is not None and self.sampling.greedy and not sampling.greedy:
            raise InvalidRequest(
                f"request {req}: sampled ({sampling.describe()}) on an engine loaded greedy (the "
                "argmax path); load it with a seeded sampler to serve per-request sampling"
            )
        if sampling is not None and (sampling.top_k < 1 or not 0 < sampling.top_p <= 1
                                     or sampling.temperature <= 0 or sampling.min_tokens < 0
                                     or sampling.repetition_penalty <= 0):
            raise InvalidRequest(f"request {req}: impossible sampling {sampling.describe()}")
        wanted = None if sampling is None else sampling.logprobs
        if wanted is not None and not 0 <= wanted <= self.serving.max_logprobs:
            raise InvalidRequest(f"request {req}: logprobs={wanted}; this engine serves 0 to "
                                 f"{self.serving.max_logprobs} (ServingConfig.max_logprobs)")
        if sampling is not None and sampling.min_tokens and len(stops) > BANNED:
            raise InvalidRequest(f"request {req}: min_tokens masks at most {BANNED} stop ids")
        if sampling is not None:
            self._check_masks(req, sampling)
        self.runner.requests.submit(req, _Request(ids, max_tokens, stops, self._arrivals,
                                                  host_sync or constraint is not None, sampling,
                                                  constraint))
        self._arrivals += 1

    def _check_masks(self, req: int, s: SamplingParams) -> None:
        """InvalidRequest unless its bias, allowed ids, bad words and min_p fit the device's
        tables and the vocabulary."""
        vocab = self.model.vocab
        ids = [t for t, _ in s.logit_bias] + sorted(s.allowed_ids or ()) + [
            t for w in s.bad_words for t in w]
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise InvalidRequest(f"request {req}: token id {outside[0]} is outside the "
                                 f"vocabulary [0, {vocab}) of {self.model.name}")
        if s.allowed_ids is not None and not s.allowed_ids:
            raise InvalidRequest(f"request {req}: allowed_token_ids is empty")
        if len(s.bad_words) > BAD_WORDS or any(not 1 <= len(w) <= BAD_WORD_IDS
                                               for w in s.bad_words):
            raise InvalidRequest(f"request {req}: the device holds {BAD_WORDS} bad words of 1 "
                                 f"to {BAD_WORD_IDS} ids each")
        if not 0 <= s.min_p <= 1:
            raise InvalidRequest(f"request {req}: min_p must be in [0, 1], got {s.min_p}")

    def abort(self, req: int) -> None:
        if self.runner.requests.withdraw(req):
            return
        self.runner.abort(req)
        self._reclaim()

    def preempt(self, req: int) -> None:
        self.runner.preempt(req)
        self.kv.preemptions += 1
        self.kv.preempted.add(req)
        self._reclaim()

    def resume(self, req: int) -> None:
        raise NotImplementedError("the serving engine resumes preempted requests itself")

    def tokens(self, req: int) -> list[int]:
        return self.delivered(req)

    def logprobs(self, req: int) -> list[TokenLogprobs] | None:
        """Per delivered token of `req`: its logprob and the top ones it asked for; None if it
        asked for none."""
        w = self.requests.get(req)
        n = None if w is None or w.sampling is None else w.sampling.logprobs
        if n is None:
            return None
        return [TokenLogprobs(lp.sampled, lp.top[:n]) for lp in self.runner.requests[req].logprobs]

    def idle(self) -> bool:
        r = self.runner
        waiting = any(r.requests[q].status == Status.PREEMPTED for q in r.open_requests())
        return not self.queued and not waiting and not r.queue and not r.eligible()

    def run(self, max_iterations: int = 1_000_000) -> None:
        """Step until idle: NoProgress once it moves nothing (`Watchdog`), RuntimeError past
        `max_iterations` (the last resort)."""
        watchdog = Watchdog(self)
        for _ in range(max_iterations):
            self.step()
            if self.idle():
                return
            watchdog.check()
        raise RuntimeError(f"the engine did not go idle within {max_iterations} iterations")

    # --- progress (`engine.Watchdog`) ------------------------------------------------------------
    def progress(self) -> Hashable:
        """The runner's progress, plus each prefill's: context tokens its partial chunks
        computed so far, and which requests still need their prefill to end."""
        return (super().progress(), tuple(sorted(self.prefilled.items())),
                tuple(sorted(self.needs_prefill)))

    def _stalled_request(self, q: int) -> str:
        line = super()._stalled_request(q)
        if q not in self.needs_prefill:
            return line
        return (f"{line}, prefill {self.prefilled.get(q, 0)}/{self._prefill_tokens(q)} "
                "context tokens, not ended")

    @property
    def queued(self) -> list[int]:
        """Submitted, never admitted, in arrival order (the request table's)."""
        return self.runner.requests.queued()

    def _not_admitted(self) -> int:
        return len(self.queued)

    # --- the engine's hooks ----------------------------------------------------------------------
    def _admit(self) -> None:
        """Reclaim blocks, preempt while over budget, then resume and admit while it fits."""
        self._reclaim()
        r = self.runner
        victims = set()
        while self._over_budget():
            running = [q for q in self.block_of if r.status(q) == Status.RUNNING]
            if not running:
                break
            victim = max(running, key=lambda q: self.requests[q].arrival)
            self.preempt(victim)
            victims.add(victim)
        preempted = sorted(
            (q for q in r.open_requests() if r.requests[q].status == Status.PREEMPTED),
            key=lambda q: self.requests[q].arrival,
        )
        for req in preempted:
            # A request preempted just now waits a step: resuming it at once would only thrash.
            # Under keep it also waits until its in-flight tokens are delivered (no placeholder).
            if req in victims or r.live_rows(req) or not self._fits(req):
                return  # first come, first served: nobody overtakes a preempted request
            r.resume(req)
            self._take_block(req)
            self.kv.resumes += 1
            self.kv.resumed_at[req] = len(r.requests[req].delivered)
        while self.queued and self._fits(self.queued[0]) and self._row_free():
            req = self.queued[0]
            w = self.requests[req]
            r.arrive(req, w.prompt[-1], max_tokens=w.max_tokens, host_sync=w.host_sync)
            self._take_block(req)
        self.kv.peak_tokens = max(self.kv.peak_tokens, self._usage())

    def _scheduled(self, q: int) -> None:
        """Stage the step's context rows: block, write index, and prefill from host tokens."""
        step = self.runner.queue[q]
        live = [row for row in step.rows if row.live]
        if any(row.partial for row in live) and any(row.prev_row is not None for row in live):
            self.kv.chunks_beside_mirror += 1
        # What the step computes: a prefilling row its chunk, a decoding row 1 + its drafts.
        tokens = sum(self.chunk[row.req] if row.req in self.chunk else 1 + row.spec
                     for row in live)
        self.kv.peak_step_tokens = max(self.kv.peak_step_tokens, tokens)
        context = StepContext(tuple(self._context_row(q, row) for row in step.rows))
        live_params = {(k, p, t) for k, p, t, active in zip(
            context.top_k, context.top_p, context.temperature, context.active, strict=True)
            if active}
        if len(live_params) > 1:
            self.kv.mixed_sampling_steps += 1  # requests with different parameters, one step
        self.context.stage(context)

    def _context_row(self, q: int, row: Row) -> ContextRow:
        """What the decoder op needs of `row` of step q beside the runner's record."""
        w = self.requests[row.req]
        at = len(w.prompt) - 1 + row.pos
        fresh = row.live and row.req in self.needs_prefill
        if fresh and row.partial:
            # A partial chunk ends inside the context: its sampled id is discarded.
            at = self.prefilled.get(row.req, 0) + self.chunk[row.req] - 1
            self.prefilled[row.req] = at + 1
            self.kv.partial_chunks += 1
        allowed = self._allowed(q, row.req) if row.live and w.constraint else None
        draft_allowed: tuple[frozenset[int], ...] = ()
        if allowed is not None and row.spec:  # host drafts: the host builds each lane's mask
            grammar, known = GRAMMARS[w.constraint or ""], self._known(row.req)
            draft_allowed = tuple(grammar.allowed(known + row.drafts[:j], self.model.vocab)
                                  for j in range(1, row.spec + 1))
        given = self.masks.get(row.req) if row.live else None
        if given is not None:  # the scheduler's own mask (vLLM's grammar bitmask), per lane
            allowed = given[0] if allowed is None else allowed & given[0]
            draft_allowed = given[1:]
        static = (w.sampling or self.sampling).allowed_ids
        if static is not None and row.live:  # a fixed set, on every lane: no host sync needed
            allowed = static if allowed is None else allowed & static
            draft_allowed = tuple(a & static for a in draft_allowed) or (static,) * self.k
        prefill = None
        if fresh:
            # Re-entering: the block is rebuilt from the host's authoritative tokens.
            prefill = self._known(row.req)[:at]
            if not row.partial:
                self.needs_prefill.discard(row.req)
                self.prefilled.pop(row.req, None)
                self.kv.prefills += 1
        own = w.sampling or self.sampling
        if self.k:  # the lanes' index is the offset plus the position, which the device holds
            at = at - row.pos if row.pos >= 0 else len(w.prompt) - 1
        return ContextRow(
            row=row,
            block=self.block_of.get(row.req, 0),
            write_at=at,
            prefill=prefill,
            key=draw_key(row.req, w.sampling),
            sampling=own,
            banned=tuple(sorted(w.stop_ids)) if own.min_tokens else (),
            allowed=allowed,
            draft_allowed=draft_allowed,
        )

    def _known(self, req: int) -> tuple[int, ...]:
        """The host's authoritative tokens of `req`: its prompt, then what it was delivered."""
        return self.requests[req].prompt + tuple(self.runner.requests[req].delivered)

    # --- KV blocks and budget --------------------------------------------------------------------
    def validate(self, req: int, prompt: Sequence[int], max_tokens: int) -> tuple[int, ...]:
        """The request's prompt ids, or InvalidRequest saying why it can never be served."""
        if isinstance(req, bool) or not isinstance(req, int) or not 0 <= req < REQUEST_IDS:
            raise InvalidRequest(f"request id {req!r} must be an integer in [0, 2**30)")
        if req in self.requests or req in self.runner.requests:
            raise InvalidRequest(f"request {req} was already submitted")
        ids = tuple(prompt)
        if not ids:
            raise InvalidRequest(f"request {req}: the prompt is empty")
        vocab = self.model.vocab
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidRequest(
                    f"request {req}: prompt id {t!r} at index {i} is outside the vocabulary "
                    f"[0, {vocab}) of {self.model.name}"
                )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidRequest(f"request {req}: max_tokens must be a positive integer")
        need = len(ids) - 1 + max_tokens
        if need > self.model.max_context - 1:
            raise InvalidRequest(
                f"request {req}: prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds the "
                f"context of {self.model.name} ({self.model.max_context})"
            )
        budget = self.serving.kv_tokens
        if budget is not None and need > budget:
            raise InvalidRequest(
                f"request {req}: it needs {need} KV tokens, the budget is {budget} in all"
            )
        return ids

    def _allowed(self, q: int, req: int) -> frozenset[int]:
        """The ids a constrained request's next token may take, from the host's tokens."""
        r = self.runner
        if any(row.live and row.req == req for j, s in enumerate(r.queue) if j != q
               for row in s.rows):
            # Host-sync keeps this from happening; if it did, the mask would miss the newest token.
            raise PhaseError(f"request {req} is constrained but has a step in flight: its "
                               "mask would be built without its newest token")
        grammar = GRAMMARS[self.requests[req].constraint or ""]
        self.kv.constrained_rows += 1
        return grammar.allowed(self._known(req), self.model.vocab)

    def _plan(self, rows: list[int]) -> tuple[list[int], list[int] | None]:
        """With `subsets`, vLLM's choices (rule 14): under the step's token budget the decoding
        rows come first, each with as many of its drafts as the budget leaves after its newest
        token, then the prefills (at least a token each); a request the budget cannot hold is
        left out, in the order the policy gave. A row never carries more drafts than the
        model's context holds after its newest token. Without `subsets`, every row, all its
        drafts."""
        c, r = self.serving, self.runner
        self._planned = {}
        if not c.subsets:
            return rows, None
        left = c.max_step_tokens
        decoding = [q for q in rows if q not in self.needs_prefill]
        prefilling = [q for q in rows if q in self.needs_prefill]
        for q in decoding:
            if left is not None and left < 1:
                break
            due = r.spec_due(q)
            room = min(due, self._context_room(q))
            drafts = room if left is None else min(room, left - 1)
            if left is not None:
                left -= 1 + drafts
            self.kv.context_trimmed_drafts += due - room
            self.kv.budget_trimmed_drafts += room - drafts
            self._planned[q] = drafts
        for q in prefilling:
            if left is not None and left < 1:
                break
            if left is not None:
                left -= 1  # its chunk takes at least one token: `_before_schedule` sizes it
            self._planned[q] = 0
        self.kv.left_out_rows += len(rows) - len(self._planned)
        chosen = [q for q in rows if q in self._planned]  # in the policy's order
        return chosen, [self._planned[q] for q in chosen] if self.k else None

    def _context_room(self, req: int) -> int:
        """Drafts `req`'s decoding row may carry within the model's context: the positions
        after its newest token's (the host's count, which in-flight drafts can only over-
        state: a rejected one is rolled back at apply)."""
        r = self.runner
        newest = len(self.requests[req].prompt) - 1 + len(r.requests[req].delivered) + r.owed(
            req)
        return max(self.model.max_context - 1 - newest, 0)

    def _before_schedule(self, rows: list[int]) -> None:
        """Size this step's prefill chunks: a decoding row takes one token; the prefilling
        requests, in arrival order, share what the step's budget leaves (each at least one, and
        at most `prefill_chunk`). A chunk that does not finish its prefill is a partial row."""
        c, r = self.serving, self.runner
        if len(rows) > 1 and rows != sorted(rows):  # the policy really moved rows off id order
            self.stats["steps_out_of_id_order"] += 1
        prefilling = sorted((q for q in rows if q in self.needs_prefill),
                            key=lambda q: self.requests[q].arrival)
        # A decoding row takes 1 + the drafts it will carry (rule 13; planned, with subsets).
        decodes = sum(1 + self._planned.get(q, r.spec_due(q))
                      for q in rows if q not in self.needs_prefill)
        left = None if c.max_step_tokens is None else c.max_step_tokens - decodes
        self.chunk = {}
        for i, req in enumerate(prefilling):
            remaining = self._prefill_tokens(req) - self.prefilled.get(req, 0)
            give = remaining if c.prefill_chunk is None else min(remaining, c.prefill_chunk)
            if left is not None:
                fits = left - (len(prefilling) - 1 - i)  # a token for each later prefill
                if fits < give:
                    give = fits
                    self.kv.budget_cut_chunks += 1
                left -= give
            r.chunk_prefill(req, partial=give < remaining)
            self.chunk[req] = give

    def _prefill_tokens(self, req: int) -> int:
        """Context tokens `req`'s prefill writes: its prompt and what it was delivered."""
        return len(self.requests[req].prompt) + len(self.runner.requests[req].delivered)

    def _context_after_step(self, req: int) -> int:
        """Context tokens `req` holds once the next step ran (in-flight tokens included). With
        drafts every in-flight step of it holds KV for its 1 + spec tokens (its placeholders),
        and the next one for 1 + the drafts it will carry: rejected drafts' KV is dead, but
        written."""
        r = self.runner
        grows = r.status(req) in (Status.WAITING, Status.RUNNING) and r.next_pos(req) < (
            self.requests[req].max_tokens
        )
        held = len(r.requests[req].delivered) + r.owed(req)  # without drafts: next_pos
        step = 1 + r.spec_due(req) if grows else 0
        return len(self.requests[req].prompt) - 1 + held + step

    def _usage(self) -> int:
        return sum(self._context_after_step(q) for q in self.block_of)

    def _over_budget(self) -> bool:
        budget = self.serving.kv_tokens
        return budget is not None and self._usage() > budget

    def _fits(self, req: int) -> bool:
        if not self.free_blocks:
            return False
        budget = self.serving.kv_tokens
        if budget is None:
            return True
        delivered = len(self.runner.requests[req].delivered) if req in self.runner.requests else 0
        need = len(self.requests[req].prompt) + delivered  # its context after one step
        return self._usage() + need <= budget

    def _take_block(self, req: int) -> None:
        self.block_of[req] = self.free_blocks.pop(0)
        self.needs_prefill.add(req)
        self.prefilled.pop(req, None)  # a resumed request prefills its whole context again

    def _reclaim(self) -> None:
        """Free the blocks of requests that closed or were preempted (device order keeps any
        in-flight write to a freed block ahead of its next owner's prefill)."""
        for req in list(self.block_of):
            status = self.runner.status(req)
            if status in CLOSED or status == Status.PREEMPTED:
                self.free_blocks.append(self.block_of.pop(req))
                self.needs_prefill.discard(req)
        self.free_blocks.sort()

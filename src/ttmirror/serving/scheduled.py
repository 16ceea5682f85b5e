"""The serving engine with its decisions made elsewhere: a foreign scheduler's steps, executed.

`ServingEngine` decides itself which requests enter, which are preempted and resumed, and how
long each prefill chunk is. `ScheduledEngine` takes every one of those decisions from a
`Plan`, one per step, as a scheduler that is not ours hands them down (vLLM's
`SchedulerOutput`, through the bridge in `vllm_bridge/`), and executes the step on the runner
and its mirror exactly as the serving loop would. The foreign scheduler also decides when a
request stops (its stop ids and lengths are checked there): the engine closes what the plan
says has finished.

The split follows async scheduling's: `launch(plan)` builds and launches one step (the mirror
supplies the newest tokens of requests whose previous step is still in flight); `collect()`
completes the oldest step's readback and returns its tokens. Between the two, the scheduler
plans the next step without those tokens.

Whatever the plan asks that the model does not allow is refused, in one line naming the
request and what differed, and the runner never executes a schedule the model forbids. A
refusal is the request's own: the request is aborted (`Runner.abort` with the reason, or
`Runner.refuse` if it never arrived), its rows leave the step, and the step goes on with the
others. So does a device fault: the requests of the failed step fail, the rest go on. Each
launch and collect says which requests it refused or failed (`refused`), so that the
scheduler can end them with an error of their own.

A sampled request without a seed of its own (`NewRequest.draw_seed`) gets one at arrival from
the engine's seeded stream (`Random(engine seed)`, one draw per such arrival, in arrival
order), recorded in its `arrive` event: the run replays exactly, and async equals sync for the
same arrivals.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..impl.backend import TokenLogprobs
from ..impl.runner import CLOSED, DeviceFault, PhaseError, Status
from .backend import ServingBackend
from .batching import InvalidRequest, ServingConfig, ServingEngine
from .context import SamplingParams

SEED_RANGE = 1 << 31
"""Drawn seeds are below this (an event's integers are at most 2**31 - 1)."""


class Disagreement(RuntimeError):
    """The plan and the runner disagree on a request's state (tokens, position, rows)."""


@dataclass(frozen=True)
class NewRequest:
    req: int
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    sampling: SamplingParams | None = None
    draw_seed: bool = False
    """Sampled with no seed of its own: the engine draws one at arrival (`sampling` holds
    the rest of its parameters)."""
    refuse: str | None = None
    """Why the engine must refuse it at arrival (a parameter the mirror does not serve)."""
    host_sync: bool = False
    """Its scheduler builds each step's mask from its tokens (structured output): it needs its
    newest token on the host before each step."""


@dataclass(frozen=True)
class Plan:
    """One step as the foreign scheduler decided it."""

    rows: tuple[int, ...]
    """The requests the step computes, in the scheduler's order."""
    tokens: dict[int, int]
    """Tokens the step computes per request (a prefill chunk's length, or 1 for a decode)."""
    computed: dict[int, int]
    """Tokens each scheduled request had computed before the step (the scheduler's count)."""
    new: tuple[NewRequest, ...] = ()
    resumed: frozenset[int] = frozenset()
    """Preempted requests that re-enter with this step (their context prefilled again)."""
    preempted: frozenset[int] = frozenset()
    finished: frozenset[int] = frozenset()
    """Requests the scheduler closed since its last plan (stopped, at length, or aborted)."""
    spec: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Draft ids each decoding row carries: known ones (the host's, at depth 1) or
    placeholders (-1: on the device, under async scheduling)."""
    masks: dict[int, tuple[frozenset[int], ...]] = field(default_factory=dict)
    """The ids each structured-output row may draw, per query token (its next token, then the
    token after each draft): the scheduler's grammar bitmask, applied on the device."""


@dataclass
class Collected:
    """The oldest step's result: per request the tokens it delivered (none for a partial
    prefill chunk or a dropped row), and their logprobs when asked for."""

    step: int
    tokens: dict[int, list[int]]
    logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    """Requests that failed with this step (a device fault), each with its reason."""


class ScheduledEngine(ServingEngine):
    def __init__(self, backend: ServingBackend, config: ServingConfig | None = None) -> None:
        # A foreign scheduler leaves requests out of steps and trims drafts (rule 14).
        super().__init__(backend, dataclasses.replace(config or ServingConfig(), subsets=True))
        self.closed_as: dict[int, str] = {}
        """How each request the plans finished was closed here: finish, abort or refused."""
        self.refused: dict[int, str] = {}
        """Every request refused or failed here, with its reason; a later plan that still
        names one (its scheduler has not heard yet) leaves it out."""
        self.seeds = random.Random(self.sampling.seed or 0)
        """The engine's seeded stream: one seed per sampled arrival without one of its own."""
        self._refused_now: dict[int, str] = {}
        self.readback_wait = 0.0
        """Seconds the host waited in readbacks (the device's share of a collect)."""
        self.unverified: dict[int, tuple[int, int]] = {}
        """Per request, the step whose last prefill chunk carried drafts, and how many."""

    # --- one step --------------------------------------------------------------------------------
    def launch(self, plan: Plan) -> int:
        """Apply the plan's closes, preemptions, arrivals and resumes, then schedule, stage,
        combine, launch and issue the readback of its step; returns the step's index (-1 for
        a plan that schedules nothing: its closes and preemptions are applied all the same).
        What it refused or failed: `take_refused()`."""
        plan = self._without_refused(plan)
        for req in sorted(plan.finished):
            self._close(req)
        self._reclaim()  # the blocks of requests closed since (at their length, too)
        for req in sorted(plan.preempted):
            self._refusing(req, self.preempt, req)
        for new in plan.new:
            self._arrive(new)
        for req in sorted(plan.resumed):
            self._refusing(req, self._resume, req)
        for req in (*(n.req for n in plan.new), *sorted(plan.resumed)):
            if req not in self.refused:
                self._refusing(req, self._cached_prefix, plan, req)
        r = self.runner
        for req in plan.rows:
            if req not in self.refused:
                self._refusing(req, self._check_row, plan, req)
        rows = [req for req in plan.rows if req not in self.refused]
        eligible = r.eligible()
        for req in sorted(set(rows) - set(eligible)):
            self._refuse(req, f"request {req} is in the plan's step but not eligible in the "
                         f"model's ({r.status(req).name})")
        rows = [req for req in rows if req not in self.refused]
        if not rows:
            return -1  # a plan of closes only, or of refused rows: no step
        self._plan_chunks(plan, rows)
        self.masks = plan.masks
        drafts = None
        if r.config.drafts is not None:  # each decoding row's drafts, as its scheduler chose
            drafts = [0 if req in self.needs_prefill else len(plan.spec.get(req, ()))
                      for req in rows]
        q = r.schedule(rows, drafts)
        step: int = r.queue[q].index
        fault = self._issue(q)
        if fault is not None:
            self._fail_alone(fault)
            return -1
        return step

    def take_refused(self) -> dict[int, str]:
        """The requests refused or failed since the last call, each with its reason."""
        out, self._refused_now = self._refused_now, {}
        return out

    def collect(self) -> Collected:
        """Complete the oldest step's readback and apply it; release what can be. A device
        fault fails the step's requests alone (`Collected.refused`)."""
        r = self.runner
        step = r.queue[0].index
        rows = [row.req for row in r.queue[0].rows if row.live and not row.partial]
        started = time.perf_counter()
        try:
            r.readback_complete(0)
        except DeviceFault as fault:
            self._fail_alone(fault)
            return Collected(step, {req: [] for req in rows}, refused=self.take_refused())
        finally:
            self.readback_wait += time.perf_counter() - started
        before = {req: len(r.requests[req].delivered) for req in rows}
        r.apply()
        self._release_free_slots()
        out = Collected(step, {})
        for req in rows:
            got = r.requests[req].delivered[before[req]:]
            out.tokens[req] = list(got)
            if r.requests[req].logprobs and got:
                out.logprobs[req] = list(r.requests[req].logprobs[-len(got):])
        return out

    # --- refusals --------------------------------------------------------------------------------
    def _without_refused(self, plan: Plan) -> Plan:
        """The plan less the requests refused earlier (its scheduler plans them until it hears)."""
        gone = dict(self.refused)
        if not gone:
            return plan
        for req in plan.finished & gone.keys():
            del self.refused[req]  # its scheduler has ended it: no later plan names it
        return dataclasses.replace(
            plan, rows=tuple(q for q in plan.rows if q not in gone),
            new=tuple(n for n in plan.new if n.req not in gone),
            resumed=plan.resumed - gone.keys(), preempted=plan.preempted - gone.keys(),
            finished=plan.finished - gone.keys())

    def _refusing(self, req: int, call: Callable[..., object], *args: object) -> None:
        """`call(*args)`, refusing `req` alone if the model does not allow what it asks."""
        try:
            call(*args)
        except (Disagreement, PhaseError, InvalidRequest) as e:
            self._refuse(req, str(e))

    def _refuse(self, req: int, reason: str) -> None:
        """End `req` alone with `reason`: aborted if it arrived (its rows leave the steps in
        flight), else recorded as refused; its scheduler is told (`take_refused`)."""
        r = self.runner
        if req in r.requests:
            if r.status(req) not in CLOSED:
                r.abort(req, reason)
                self._reclaim()
        else:  # queued (submitted, never admitted) or never submitted: refused all the same
            r.requests.withdraw(req)
            r.refuse(req, reason)
        self.closed_as[req] = "refused"
        self.refused[req] = self._refused_now[req] = reason

    def _fail_alone(self, fault: DeviceFault) -> None:
        """A device fault: the failed step's requests fail with it, the others go on."""
        reason = f"device fault: {fault}"
        for req in self._fail(fault):
            self.closed_as[req] = "failed"
            self.refused[req] = self._refused_now[req] = reason

    # --- the plan's decisions --------------------------------------------------------------------
    def _close(self, req: int) -> None:
        """The scheduler closed `req`: a stop token it was just delivered finishes it; anything
        else (a request the user aborted) aborts it. Closed already (at its length): nothing."""
        r = self.runner
        if r.requests.is_queued(req):  # never entered the runner
            self.abort(req)
            self.closed_as[req] = "abort"
            return
        if req not in r.requests or r.status(req) in CLOSED:
            return
        x = r.requests[req]
        stops = self.requests[req].stop_ids
        # With drafts the stop may be any token of the last run; the scheduler cut the run there.
        run = r.last_runs.get(req, ()) if self.k else tuple(x.delivered[-1:])
        at = next((i for i, token in enumerate(run) if token in stops), None)
        if x.unchecked and at is not None:
            r.finish(req, keep=at + 1 if self.k else None)
            self.closed_as[req] = "finish"
        else:
            self.abort(req)
            self.closed_as[req] = "abort"
        self._reclaim()

    def _arrive(self, new: NewRequest) -> None:
        """Admit `new`, or refuse it alone (a parameter the mirror does not serve, a request
        the engine can never serve, no row for it)."""
        if new.refuse is not None:
            self._refuse(new.req, new.refuse)
            return
        sampling, seed = new.sampling, None
        if new.draw_seed:
            if self.sampling.greedy:
                self._refuse(new.req, f"request {new.req} is sampled; this engine was loaded "
                             "greedy (the argmax path): load it with a seeded sampler")
                return
            seed = self.seeds.randrange(SEED_RANGE)
            sampling = dataclasses.replace(sampling or SamplingParams(), seed=seed)
        try:
            self.submit(new.req, new.prompt, max_tokens=new.max_tokens, stop_ids=new.stop_ids,
                        sampling=sampling, host_sync=new.host_sync)
        except InvalidRequest as e:
            self._refuse(new.req, str(e))
            return
        if not self.free_blocks or not self._row_free():
            self._refuse(new.req, f"request {new.req} arrives with every one of the "
                         f"{self.serving.rows} rows taken")
            return
        self.runner.arrive(new.req, new.prompt[-1], max_tokens=new.max_tokens, seed=seed,
                           host_sync=new.host_sync)
        self._take_block(new.req)

    def _resume(self, req: int) -> None:
        self.runner.resume(req)
        if not self.free_blocks:
            raise Disagreement(f"request {req} resumes with every row taken")
        self._take_block(req)
        self.kv.resumes += 1
        self.kv.resumed_at[req] = len(self.runner.requests[req].delivered)

    def _cached_prefix(self, plan: Plan, req: int) -> None:
        """A request (re)entering with tokens its scheduler had cached (vLLM's prefix cache: the
        plan's computed count above 0) prefills only the rest: its block is written from the
        host's tokens all the same, the cached prefix included (the history is the recompute
        form of a KV cache), so nothing computed is skipped, only scheduled apart."""
        cached = plan.computed.get(req, 0)
        if not cached:
            return
        whole = self._prefill_tokens(req)
        if not 0 < cached < whole:
            raise Disagreement(f"request {req}: {cached} of its {whole} context tokens cached; "
                               "a cached prefix leaves at least one token to compute")
        self.prefilled[req] = cached
        self.kv.prefix_hits += 1
        self.kv.prefix_tokens += cached

    def _check_position(self, plan: Plan, req: int) -> None:
        """The scheduler's count of computed tokens is the runner's: prefilled context tokens
        while prefilling, else the prompt and every token delivered or owed by a step in flight
        (its placeholders: 1 + its drafts each, as a scheduler counts them before it knows how
        many were accepted), but the newest, whose KV the step writes."""
        r = self.runner
        if req in self.needs_prefill:
            ours = self.prefilled.get(req, 0)
        else:
            ours = len(self.requests[req].prompt) - 1 + len(r.requests[req].delivered) \
                + r.owed(req) + self._unverified_in_flight(req)
        theirs = plan.computed[req]
        if theirs != ours:
            raise Disagreement(f"request {req}: the plan says {theirs} tokens computed, the "
                               f"runner {ours} ({r.status(req).name}, "
                               f"{len(r.requests[req].delivered)} delivered, "
                               f"{r.live_rows(req)} row(s) in flight)")

    def _check_row(self, plan: Plan, req: int) -> None:
        """Disagreement unless the plan's row of `req` is one the model allows: its position,
        its drafts (rule 13), its prefill chunk. Changes nothing."""
        self._check_position(plan, req)
        r = self.runner
        if req not in self.needs_prefill:
            drafts, due = plan.spec.get(req, ()), r.spec_due(req)
            if len(drafts) > due or plan.tokens[req] != 1 + len(drafts):
                raise Disagreement(f"request {req} decodes {plan.tokens[req]} tokens with "
                                   f"{len(drafts)} draft(s) in the plan; the runner's row "
                                   f"has {due} draft(s) (rule 13)")
            # Known drafts lead (vLLM pads those its grammar rejected with -1 after them).
            known = tuple(itertools.takewhile(lambda d: d >= 0, drafts))
            held = r.requests[req].host_drafts[:due]
            if any(d >= 0 for d in drafts[len(known):]) or known != held[:len(known)]:
                raise Disagreement(f"request {req}: the plan's drafts {list(drafts)} are not "
                                   f"the ones read back with its last step {list(held)}")
            return
        remaining = self._prefill_tokens(req) - self.prefilled.get(req, 0)
        give, carried = plan.tokens[req], len(plan.spec.get(req, ()))
        if carried and give - carried != remaining:
            raise Disagreement(f"request {req}: {carried} draft(s) on a prefill chunk of "
                               f"{give - carried} tokens with {remaining} left to prefill")
        if not 1 <= give - carried <= remaining:
            raise Disagreement(f"request {req}: a prefill chunk of {give} tokens with "
                               f"{remaining} left to prefill")

    def _plan_chunks(self, plan: Plan, rows: Sequence[int]) -> None:
        """The plan's prefill chunks (checked by `_check_row`): a chunk short of the context is
        a partial row. A scheduler may put drafts on the chunk that ends a prefill (vLLM does,
        for a request resumed with drafts it held): the row prefills and samples its next token
        as any last chunk, and its drafts go unverified, as all rejected; the scheduler counted
        them computed until it hears so (`_unverified_in_flight`)."""
        r = self.runner
        self.chunk = {}
        for req in rows:
            if req in self.needs_prefill:
                drafts = len(plan.spec.get(req, ()))
                give = plan.tokens[req] - drafts
                remaining = self._prefill_tokens(req) - self.prefilled.get(req, 0)
                r.chunk_prefill(req, partial=give < remaining)
                self.chunk[req] = give
                if drafts:
                    self.unverified[req] = (r.steps, drafts)  # the step scheduled next
                    self.kv.drafts_on_prefill += 1

    def _unverified_in_flight(self, req: int) -> int:
        """Drafts the scheduler put on a last prefill chunk of `req` still in flight: it counts
        them computed (as placeholders) until that step's tokens reach it."""
        step, drafts = self.unverified.get(req, (-1, 0))
        if not any(s.index == step for s in self.runner.queue):
            self.unverified.pop(req, None)
            return 0
        return drafts

    def host_drafts(self) -> dict[int, tuple[int, ...]]:
        """Open requests whose next row carries drafts, with the drafts read back for it."""
        r = self.runner
        return {q: r.requests[q].host_drafts for q in r.open_requests()
                if r.spec_due(q) and r.status(q) not in CLOSED}

    def status(self, req: int) -> Status:
        return self.runner.status(req)

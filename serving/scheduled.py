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

Whatever the plan asks that the model does not allow is refused by the runner (`PhaseError`)
or here (`Disagreement`), in one line naming the request and what differed: the runner never
executes a schedule the model forbids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..impl.backend import TokenLogprobs
from ..impl.runner import CLOSED, DeviceFault, Status
from .backend import ServingBackend
from .batching import ServingConfig, ServingEngine
from .context import SamplingParams


class Disagreement(RuntimeError):
    """The plan and the runner disagree on a request's state (tokens, position, rows)."""


@dataclass(frozen=True)
class NewRequest:
    req: int
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    sampling: SamplingParams | None = None


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


@dataclass
class Collected:
    """The oldest step's result: per request the tokens it delivered (none for a partial
    prefill chunk or a dropped row), and their logprobs when asked for."""

    step: int
    tokens: dict[int, list[int]]
    logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)


class ScheduledEngine(ServingEngine):
    def __init__(self, backend: ServingBackend, config: ServingConfig | None = None) -> None:
        super().__init__(backend, config)
        self.closed_as: dict[int, str] = {}
        """How each request the plans finished was closed here: finish or abort."""

    # --- one step --------------------------------------------------------------------------------
    def launch(self, plan: Plan) -> int:
        """Apply the plan's closes, preemptions, arrivals and resumes, then schedule, stage,
        combine, launch and issue the readback of its step; returns the step's index (-1 for
        a plan that schedules nothing: its closes and preemptions are applied all the same)."""
        for req in sorted(plan.finished):
            self._close(req)
        self._reclaim()  # the blocks of requests closed since (at their length, too)
        for req in sorted(plan.preempted):
            self.preempt(req)
        for new in plan.new:
            self._arrive(new)
        for req in sorted(plan.resumed):
            self._resume(req)
        r = self.runner
        rows = list(plan.rows)
        eligible = r.eligible()
        if sorted(rows) != eligible:
            raise Disagreement(
                f"the plan's step holds requests {sorted(rows)}; the model's step holds every "
                f"eligible request: {eligible}")
        if not rows:
            return -1  # a plan of closes only: no step
        for req in rows:
            self._check_position(plan, req)
        self._plan_chunks(plan, rows)
        q = r.schedule(rows)
        step = r.queue[q].index
        with r.device_call("stage", q):
            self._scheduled(q)
        r.combine(q)
        r.launch(q)
        r.readback_issue(q)
        return step

    def collect(self) -> Collected:
        """Complete the oldest step's readback and apply it; release what can be."""
        r = self.runner
        step = r.queue[0].index
        rows = [row.req for row in r.queue[0].rows if row.live and not row.partial]
        try:
            r.readback_complete(0)
        except DeviceFault as fault:
            self._fail(fault)
            raise
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

    # --- the plan's decisions --------------------------------------------------------------------
    def _close(self, req: int) -> None:
        """The scheduler closed `req`: a stop token it was just delivered finishes it; anything
        else (a request the user aborted) aborts it. Closed already (at its length): nothing."""
        r = self.runner
        if req in self.queued:  # never entered the runner
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
        self.submit(new.req, new.prompt, max_tokens=new.max_tokens, stop_ids=new.stop_ids,
                    sampling=new.sampling)
        self.queued.remove(new.req)
        if not self.free_blocks:
            raise Disagreement(f"request {new.req} arrives with every one of the "
                               f"{self.serving.rows} rows taken")
        self.runner.arrive(new.req, new.prompt[-1], max_tokens=new.max_tokens)
        self._take_block(new.req)

    def _resume(self, req: int) -> None:
        self.runner.resume(req)
        if not self.free_blocks:
            raise Disagreement(f"request {req} resumes with every row taken")
        self._take_block(req)
        self.kv.resumes += 1
        self.kv.resumed_at[req] = len(self.runner.requests[req].delivered)

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
                + r.owed(req)
        theirs = plan.computed[req]
        if theirs != ours:
            raise Disagreement(f"request {req}: the plan says {theirs} tokens computed, the "
                               f"runner {ours} ({r.status(req).name}, "
                               f"{len(r.requests[req].delivered)} delivered, "
                               f"{r.live_rows(req)} row(s) in flight)")

    def _plan_chunks(self, plan: Plan, rows: Sequence[int]) -> None:
        """The plan's prefill chunks: a chunk short of the context is a partial row."""
        r = self.runner
        self.chunk = {}
        for req in rows:
            if req not in self.needs_prefill:
                drafts, due = plan.spec.get(req, ()), r.spec_due(req)
                if len(drafts) != due or plan.tokens[req] != 1 + due:
                    raise Disagreement(f"request {req} decodes {plan.tokens[req]} tokens with "
                                       f"{len(drafts)} draft(s) in the plan; the runner's row "
                                       f"carries {due} draft(s) (rule 13)")
                known = tuple(d for d in drafts if d >= 0)
                held = r.requests[req].host_drafts[:due]
                if known and (len(known) != due or known != held):
                    raise Disagreement(f"request {req}: the plan's drafts {list(drafts)} are not "
                                       f"the ones read back with its last step {list(held)}")
                continue
            remaining = self._prefill_tokens(req) - self.prefilled.get(req, 0)
            give = plan.tokens[req]
            if not 1 <= give <= remaining:
                raise Disagreement(f"request {req}: a prefill chunk of {give} tokens with "
                                   f"{remaining} left to prefill")
            r.chunk_prefill(req, partial=give < remaining)
            self.chunk[req] = give

    def host_drafts(self) -> dict[int, tuple[int, ...]]:
        """Open requests whose next row carries drafts, with the drafts read back for it."""
        r = self.runner
        return {q: r.requests[q].host_drafts for q in r.open_requests()
                if r.spec_due(q) and r.status(q) not in CLOSED}

    def status(self, req: int) -> Status:
        return self.runner.status(req)

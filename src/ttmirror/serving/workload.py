"""A serving workload: staggered arrivals, different lengths, stop tokens, an abort, KV pressure.

Every event that changes what a request is owed is tied to the request's own progress (the
tokens it has received), never to a step number, so the same workload must deliver the same
tokens at depth 1 and depth 2. `run_workload` also records what really happened (stops hit,
aborts with rows in flight, preemptions forced by the KV budget) so a test can require it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..impl.backend import TokenLogprobs
from ..impl.runner import Status
from .batching import ServingEngine
from .context import SamplingParams
from .engine import Watchdog


@dataclass(frozen=True)
class RequestPlan:
    req: int
    arrival: int
    """Engine iteration at which it is submitted."""
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    abort_after: int | None = None
    """Aborted once it has received this many tokens."""
    host_sync: bool = False
    """Its next step needs its newest token on the host (not scheduled while one is in flight)."""
    sampling: SamplingParams | None = None
    """Its own sampling parameters (None: the engine's)."""
    constraint: str | None = None
    """A grammar of `grammar.GRAMMARS` its tokens follow (the request is then host-sync)."""


@dataclass
class Outcome:
    tokens: dict[int, list[int]]
    statuses: dict[int, Status]
    iterations: int
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    """Per request that asked for logprobs: one entry per delivered token."""
    errors: dict[int, str] = field(default_factory=dict)
    """Per request that failed on a device fault: the device's error."""

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    def stopped(self, plan: list[RequestPlan]) -> list[int]:
        """Requests that finished on a stop token before their max_tokens."""
        by_req = {p.req: p for p in plan}
        return [
            r
            for r, toks in self.tokens.items()
            if self.statuses[r] == Status.FINISHED
            and toks
            and toks[-1] in by_req[r].stop_ids
            and len(toks) < by_req[r].max_tokens
        ]


def standard_plan(vocab: int, requests: int = 8, scale: int = 1) -> list[RequestPlan]:
    """The battery's workload: arrivals over the first dozen iterations, prompts of 2 to 6 ids,
    6 to 15 tokens each, stop sets of a quarter of the vocabulary on every third request,
    request 5 aborted after 3 tokens. Requests 1 and 2 have no stop and run together to
    contexts of 13 and 19 tokens: a KV budget under 27 must preempt. `scale` multiplies the
    lengths (benchmarks)."""
    plan = []
    for i in range(requests):
        prompt = tuple((13 * i + 7 * j + 1) % vocab for j in range(2 + i % 5))
        stops = (
            frozenset((31 * i + 11 * j) % vocab for j in range(max(1, vocab // 4)))
            if i % 3 == 0
            else frozenset()
        )
        plan.append(
            RequestPlan(
                req=i,
                arrival=(0, 0, 1, 2, 4, 6, 9, 12)[i % 8] + 14 * (i // 8),
                prompt=prompt,
                max_tokens=(6 + (5 * i) % 10) * scale,
                stop_ids=stops,
                abort_after=3 if i % 8 == 5 else None,
            )
        )
    return plan


def run_workload(
    engine: ServingEngine,
    plan: list[RequestPlan],
    *,
    on_step: Callable[[ServingEngine], None] | None = None,
    max_iterations: int = 100_000,
) -> Outcome:
    """Serve `plan` to the end: each request submitted at its arrival iteration, aborted once
    it has received `abort_after` tokens; `on_step` sees the engine after every step.
    `engine.NoProgress` once the engine stops moving (`engine.Watchdog`)."""
    pending = sorted(plan, key=lambda p: (p.arrival, p.req))
    by_req = {p.req: p for p in plan}
    aborted: set[int] = set()
    it = 0
    start = time.perf_counter()
    watchdog = Watchdog(engine)
    while True:
        while pending and pending[0].arrival <= it:
            p = pending.pop(0)
            engine.submit(p.req, p.prompt, max_tokens=p.max_tokens, stop_ids=p.stop_ids,
                          host_sync=p.host_sync, sampling=p.sampling, constraint=p.constraint)
        engine.step()
        if on_step is not None:
            on_step(engine)
        for req in due_for_abort(engine, by_req, aborted):
            engine.abort(req)
            aborted.add(req)
        it += 1
        if not pending and engine.idle():
            break
        watchdog.check()
        if it > max_iterations:
            raise RuntimeError(f"the workload did not finish within {max_iterations} iterations")
    return outcome_of(engine, it, time.perf_counter() - start, aborted)


def due_for_abort(
    engine: ServingEngine, by_req: dict[int, RequestPlan], aborted: set[int]
) -> list[int]:
    """Open requests that have received the tokens after which their plan aborts them."""
    due = []
    for req in engine.runner.open_requests():
        r = engine.runner.requests[req]
        after = by_req[req].abort_after
        if (
            after is not None
            and req not in aborted
            and len(r.delivered) >= after
            and r.status in (Status.WAITING, Status.RUNNING, Status.PREEMPTED)
        ):
            due.append(req)
    return due


def outcome_of(engine: ServingEngine, iterations: int, seconds: float,
               aborted: set[int]) -> Outcome:
    """What the run delivered, and the counters a test needs to know the scenario happened."""
    runner, kv = engine.runner, engine.kv
    return Outcome(
        tokens={req: list(r.delivered) for req, r in sorted(runner.requests.items())},
        statuses={req: r.status for req, r in sorted(runner.requests.items())},
        iterations=iterations,
        seconds=seconds,
        logprobs={req: lp for req in sorted(runner.requests)
                  if (lp := engine.logprobs(req)) is not None},
        errors={req: r.error for req, r in sorted(runner.requests.items()) if r.error},
        stats={
            **runner.describe(),
            **{f"engine_{k}": v for k, v in engine.stats.items()},
            "kv_preemptions": kv.preemptions,
            "kv_resumes": kv.resumes,
            "kv_prefills": kv.prefills,
            "kv_peak_tokens": kv.peak_tokens,
            "kv_partial_chunks": kv.partial_chunks,
            "kv_chunks_beside_mirror": kv.chunks_beside_mirror,
            "kv_budget_cut_chunks": kv.budget_cut_chunks,
            "kv_peak_step_tokens": kv.peak_step_tokens,
            "kv_mixed_sampling_steps": kv.mixed_sampling_steps,
            "kv_constrained_rows": kv.constrained_rows,
            "kv_left_out_rows": kv.left_out_rows,
            "kv_budget_trimmed_drafts": kv.budget_trimmed_drafts,
            "kv_context_trimmed_drafts": kv.context_trimmed_drafts,
            "preempted_requests": sorted(kv.preempted),
            "resumed_and_progressed": sorted(
                r for r, at in kv.resumed_at.items() if len(runner.requests[r].delivered) > at
            ),
            "aborted_requests": sorted(aborted),
        },
    )

"""A seeded serving scenario: arrivals, stop tokens, aborts, preemptions, reordered rows.

Every event that changes what a request is owed is tied to the request's progress (how many
tokens it has received), never to a step number, so the same plan must deliver exactly the same
tokens at depth 1 and depth 2; `expected()` says which, from the probe's reference numerics.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ttmirror.impl.probe import ProbeReference
from ttmirror.impl.runner import CLOSED, Status
from ttmirror.serving.engine import Engine


@dataclass(frozen=True)
class RequestPlan:
    req: int
    arrival: int  # engine iteration at which it is submitted
    prompt: int
    max_tokens: int
    stop_at: int | None  # its token at this position (1-based) is a stop token
    abort_at: int | None  # aborted once it has received this many tokens
    preempt_at: tuple[int, ...]  # preempted each time it has received this many tokens
    resume_after: int  # iterations it stays preempted


@dataclass
class Outcome:
    delivered: dict[int, list[int]]
    statuses: dict[int, Status]
    iterations: int
    stats: dict[str, int] = field(default_factory=dict)


def make_plan(seed: int, requests: int = 44, spread: int = 260) -> list[RequestPlan]:
    rng = random.Random(seed)
    plan = []
    for req in range(requests):
        max_tokens = rng.randint(4, 24)
        stop_at = rng.randint(2, max_tokens) if rng.random() < 0.3 else None
        abort_at = rng.randint(1, max_tokens - 1) if rng.random() < 0.25 else None
        preempt_at = tuple(sorted(rng.sample(range(1, max_tokens), k=min(2, max_tokens - 1))))
        plan.append(
            RequestPlan(
                req=req,
                arrival=rng.randint(0, spread),
                prompt=rng.randrange(64),
                max_tokens=max_tokens,
                stop_at=stop_at,
                abort_at=abort_at,
                preempt_at=preempt_at if rng.random() < 0.4 else (),
                resume_after=rng.randint(0, 3),
            )
        )
    return plan


def expected(plan: list[RequestPlan], reference: ProbeReference) -> dict[int, list[int]]:
    """What each request must receive: its reference sequence, cut by stop token and abort."""
    out = {}
    for p in plan:
        tokens = reference.sequence(p.prompt, p.max_tokens)
        stops = {tokens[p.stop_at - 1]} if p.stop_at else set()
        n = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
        if p.abort_at is not None and p.abort_at < n:
            n = p.abort_at
        out[p.req] = tokens[:n]
    return out


def stop_ids(p: RequestPlan, reference: ProbeReference) -> set[int]:
    if p.stop_at is None:
        return set()
    return {reference.sequence(p.prompt, p.stop_at)[-1]}


def run(engine: Engine, plan: list[RequestPlan], reference: ProbeReference) -> Outcome:
    runner = engine.runner
    resume_at: dict[int, int] = {}
    preempted: set[tuple[int, int]] = set()
    arrivals = sorted(plan, key=lambda p: p.arrival)
    by_req = {p.req: p for p in plan}
    it = 0
    while True:
        while arrivals and arrivals[0].arrival <= it:
            p = arrivals.pop(0)
            engine.submit(p.req, p.prompt, max_tokens=p.max_tokens, stop_ids=stop_ids(p, reference))
        for req, when in list(resume_at.items()):
            if runner.requests[req].status in CLOSED:
                del resume_at[req]  # keep: its kept token finished it while preempted
            elif when <= it and not runner.live_rows(req):  # keep: no placeholder left
                engine.resume(req)
                del resume_at[req]
        engine.step()
        for req, r in list(runner.requests.items()):
            p, got = by_req[req], len(r.delivered)
            if r.status in CLOSED:
                continue
            if p.abort_at is not None and got == p.abort_at:
                engine.abort(req)
                resume_at.pop(req, None)
            elif got in p.preempt_at and (req, got) not in preempted and r.status == Status.RUNNING:
                engine.preempt(req)
                preempted.add((req, got))
                resume_at[req] = it + 1 + p.resume_after
        it += 1
        if not arrivals and not resume_at and engine.idle():
            break
        if it > 10_000:
            raise RuntimeError("scenario did not finish")
    return Outcome(
        delivered={req: list(r.delivered) for req, r in runner.requests.items()},
        statuses={req: r.status for req, r in runner.requests.items()},
        iterations=it,
        stats=runner.describe(),
    )

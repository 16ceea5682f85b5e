"""The parity battery's spec-decode matrix (spec rule 13): serving with drafts.

Each cell serves one workload three times on the emulated TT device: async with K drafts per
decoding row, sync with K drafts, and sync without drafts. Drafts change how many tokens a step
delivers, never which: greedy verification is exact, and seeded verification draws each lane
with plain decoding's draw at (request, position), so it is rejection sampling for the
deterministic drafter, coupled to plain decoding's draws. So the three runs agree token for
token, status for status and logprob for logprob, greedy and seeded. The one exception is an
abort: the workload aborts a request once it has received N tokens, and with drafts the apply
that crosses N may carry up to K more, so an aborted request's tokens agree up to the shorter
run and each run got N to N + K of them.

Every cell crosses several scenarios of the battery (preemption keep and drop, chunked prefill
under a token budget, aborts, per-request sampling, penalties and min_tokens, logprobs, a
constrained host-sync request) on the probe and the three tiny architectures, and checks that
each really occurred, as `_check_scenario` does, plus what drafts add: every accepted count
0..K came back from the device, a preemption hit a row carrying drafts in flight, re-entering
rows went without drafts (validation compares every row's drafts with the model's), a stop
token inside an accepted run cut it. Every run validates against the model with drafts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest

from ttmirror.impl import mutations
from ttmirror.impl.events import Event
from ttmirror.impl.runner import Status
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import TINY
from ttmirror.serving.workload import Outcome, RequestPlan, standard_plan

from .test_async_serving import (
    LOGPROBS,
    MIN_TOKENS,
    MIXED,
    ROWS,
    VALIDATION_KILLS,
    Run,
    RunLeftTheModel,
    _check_logprobs,
    _check_scenario,
    _model,
    _order,
    _plan_for,
    _require_async,
    _serve,
)

MODELS = ["probe", *TINY]
KV = 20
"""The cells' KV budget: with drafts a decoding row holds KV for 1 + K tokens per step in
flight, so requests 1 and 2 meet over it early."""


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: the engine's sampler, K, and what the workload crosses."""

    sampling: str
    k: int
    """K on the tiny models."""
    k_probe: int = 2
    policy: str = "keep"
    chunked: bool = False
    plan: str = "standard"
    """standard, sampling (per-request sampling, penalties, min_tokens) or logprobs (logprobs
    and a constrained request)."""
    requests: int = 8
    """Requests of the standard workload (`standard_plan`)."""


CELLS = {
    "keep": Cell("greedy", 2, requests=12),
    "drop-chunked": Cell("seeded", 1, k_probe=1, policy="drop", chunked=True),
    "sampling-penalties": Cell("seeded", 1, plan="sampling"),
    "logprobs-constrained": Cell("greedy", 2, plan="logprobs", requests=12),
}
"""Seeded cells draft one token on the tiny models: their seeded draws agree with the drafter's
greedy proposal about one time in ten, so two in a row are too rare for a short workload to
show every count; the probe's drafter agrees more often. The chunked cell drafts one: its
step budget must hold 1 + K tokens per row, and a larger one cuts few prompts. Greedy, tiny
Llama's one-layer drafter agrees with it on about one token in five: the cells with two drafts
serve twelve requests, so that two accepted in a row come back too."""


def _k(cell: Cell, model: str) -> int:
    return cell.k_probe if model == "probe" else cell.k


def _plan(cell: Cell, vocab: int) -> list[RequestPlan]:
    plan = standard_plan(vocab, cell.requests)
    if cell.plan == "sampling":  # each request its own sampler; stop requests min_tokens,
        # the others penalties strong enough that no id repeats
        def own(p: RequestPlan) -> RequestPlan:
            base = MIXED[p.req % len(MIXED)]
            if p.stop_ids:
                return replace(p, sampling=replace(base, min_tokens=MIN_TOKENS))
            return replace(p, sampling=replace(base, repetition_penalty=1.5,
                                               presence_penalty=50.0))
        return [own(p) for p in plan]
    if cell.plan == "logprobs":  # every request logprobs; requests 1 and 3 a grammar
        return [replace(p, sampling=SamplingParams(logprobs=LOGPROBS),
                        constraint="alternating-parity" if p.req in (1, 3) else None)
                for p in plan]
    return plan


def _runs(model: str, cell: Cell, order: str) -> list[Run]:
    """Async with drafts, sync with drafts, sync without."""
    k = _k(cell, model)
    budget = ROWS * (1 + k) if cell.chunked else None  # a decoding row takes 1 + K tokens
    lp = LOGPROBS if cell.plan == "logprobs" else 0
    return [Run(model, cell.sampling, mode, preempt_policy=cell.policy, kv_tokens=KV,
                max_step_tokens=budget if spec else (ROWS if cell.chunked else None),
                max_logprobs=lp, row_order=order, spec_tokens=k if spec else 0)
            for mode, spec in (("auto", True), ("off", True), ("off", False))]


def agree(a: Outcome, b: Outcome, plan: list[RequestPlan], k: int) -> list[str]:
    """Where two runs of `plan` disagree (empty: they agree): statuses; tokens and logprobs,
    exactly, but for aborted requests, whose tokens agree up to the shorter run, each N to
    N + K of them where the plan aborts after N."""
    errors = []
    if a.statuses != b.statuses:
        errors.append(f"statuses {a.statuses} != {b.statuses}")
    for p in plan:
        x, y = a.tokens.get(p.req, []), b.tokens.get(p.req, [])
        lx, ly = a.logprobs.get(p.req), b.logprobs.get(p.req)
        if a.statuses.get(p.req) == Status.ABORTED and p.abort_after is not None:
            n = min(len(x), len(y))
            x, y, lx, ly = x[:n], y[:n], lx and lx[:n], ly and ly[:n]
            lengths = (len(a.tokens[p.req]), len(b.tokens[p.req]))
            if not all(p.abort_after <= m <= p.abort_after + k for m in lengths):
                errors.append(f"request {p.req} aborted after {lengths} tokens, its plan after "
                              f"{p.abort_after}, drafts {k}")
        if x != y:
            errors.append(f"request {p.req}: {x} != {y}")
        if lx != ly:
            errors.append(f"request {p.req}: logprobs differ")
    return errors


def drafted(out: Outcome, k: int, preempting: bool = True) -> list[str]:
    """What drafts add to a run's scenario, missing (empty: it all occurred): every accepted
    count 0..K came back, rows carried drafts from the device (a mirror row with drafts is
    counted by `drafted_rows` among rows read from the mirror), and with preemption one hit a
    row carrying drafts in flight and a resumed request re-entered (without drafts: validation
    holds every row's drafts to the model's)."""
    s = out.stats
    missing = [f"accepted {n} of {k}" for n in range(k + 1) if not s.get(f"accepted_{n}")]
    if not s.get("drafted_rows") or not s.get("mirror_rows"):
        missing.append("rows with drafts from the device")
    if preempting and not s.get("preempt_with_drafts_in_flight"):
        missing.append("a preemption with drafts in flight")
    if preempting and not s.get("resumed_prefills"):
        missing.append("a request re-entering after preemption")
    return missing


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("model", MODELS)
def test_spec_decode_matrix(model: str, cell: str) -> None:
    c = CELLS[cell]
    k = _k(c, model)
    plan = _plan(c, _model(model).vocab)
    order = _order(model, cell, c.sampling)
    events: list[Event] = []  # the sync run's with drafts
    fast, slow, plain = (_serve(run, plan, events if i == 1 else None)
                         for i, run in enumerate(_runs(model, c, order)))
    _require_async(fast.stats["async_enabled"], fast.stats["depth"])
    for out, depth in ((fast, 2), (slow, 1), (plain, 1)):
        _check_scenario(out, plan, depth=depth, policy=c.policy, budget=KV, order=order)
    assert drafted(fast, k) == [], "the async run with drafts"
    assert agree(fast, slow, plan, k) == [], "async with drafts != sync with drafts"
    assert agree(slow, plain, plan, k) == [], "sync with drafts != sync without"
    s = fast.stats
    if c.chunked:
        # The budget really cut prefills, one beside a row decoding from the mirror, and no
        # step computed more than it allows (a decoding row 1 + its drafts).
        assert s["kv_budget_cut_chunks"] > 0 and s["kv_chunks_beside_mirror"] > 0
        assert s["kv_peak_step_tokens"] <= ROWS * (1 + k)
    if c.plan == "sampling":
        assert s["kv_mixed_sampling_steps"] > 0
        assert all(len(set(fast.tokens[p.req])) == len(fast.tokens[p.req])
                   for p in plan if not p.stop_ids)
        assert all(not set(fast.tokens[p.req][:MIN_TOKENS]) & p.stop_ids
                   for p in plan if p.stop_ids)
    if c.plan == "logprobs":
        # One entry per delivered token, each the model's own over the request's context.
        assert all(len(fast.logprobs[p.req]) == len(fast.tokens[p.req]) for p in plan)
        _check_logprobs(fast, plan, _model(model), greedy_engine=True)
        assert s["kv_constrained_rows"] > 0 and s["host_sync_held"] > 0
        for p in plan:
            if p.constraint:
                seq = [p.prompt[-1], *fast.tokens[p.req]]
                assert all(a % 2 != b % 2 for a, b in itertools.pairwise(seq)), p.req
        # Sync, a constrained request carried drafts (async it is never in two steps in a
        # row): its lanes past the first took masks the host built after each draft.
        assert any(row.spec and row.req in (1, 3) for e in events if e.action == "schedule"
                   for row in e.get("rows"))


def test_a_stop_inside_an_accepted_run_cuts_it() -> None:
    # A stop token came back inside a run of accepted tokens: the request finished at it, its
    # run cut there, as plain decoding stops.
    found = 0
    for model in ("probe", "tiny-mistral"):
        plan = standard_plan(_model(model).vocab)
        out = _serve(Run(model, "greedy", "off", spec_tokens=2), plan)
        plain = _serve(Run(model, "greedy", "off"), plan)
        found += out.stats.get("stops_inside_run", 0)
        assert agree(out, plain, plan, 2) == [] and out.stopped(plan)
    assert found


# --- the checks of the matrix can fail -----------------------------------------------------------


def _outcome(tokens: dict[int, list[int]], aborted: int | None = None, **stats: int) -> Outcome:
    statuses = {r: Status.ABORTED if r == aborted else Status.FINISHED for r in tokens}
    return Outcome(tokens=tokens, statuses=statuses, iterations=0, seconds=0.0, stats=stats)


def test_the_agreement_fails_on_a_token_a_status_or_an_abort_too_late() -> None:
    plan = [RequestPlan(0, 0, (1,), 4), RequestPlan(1, 0, (1,), 6, abort_after=3)]
    base = _outcome({0: [5, 6, 7, 8], 1: [1, 2, 3]}, aborted=1)
    assert agree(base, _outcome({0: [5, 6, 7, 8], 1: [1, 2, 3, 4, 9]}, aborted=1), plan, 2) == []
    assert agree(base, _outcome({0: [5, 6, 7, 9], 1: [1, 2, 3]}, aborted=1), plan, 2)
    assert agree(base, _outcome({0: [5, 6, 7, 8], 1: [1, 2, 3]}), plan, 2)  # status
    assert agree(base, _outcome({0: [5, 6, 7, 8], 1: [1, 2, 4, 4]}, aborted=1), plan, 2)
    assert agree(base, _outcome({0: [5, 6, 7, 8], 1: [1, 2, 3, 4, 5, 6]}, aborted=1), plan, 2)


def test_the_scenario_check_of_drafts_fails_where_a_count_never_came_back() -> None:
    full = dict(accepted_0=3, accepted_1=2, accepted_2=1, drafted_rows=6, mirror_rows=4,
                preempt_with_drafts_in_flight=1, resumed_prefills=1)
    assert drafted(_outcome({}, **full), 2) == []
    for missing in full:
        assert drafted(_outcome({}, **{k: v for k, v in full.items() if k != missing}), 2)


# --- validation: a planted runner bug with drafts leaves the model ------------------------------


@pytest.mark.parametrize("bug", sorted(VALIDATION_KILLS))
def test_validation_kills_each_serving_loop_bug_with_drafts(bug: str) -> None:
    run, kind = VALIDATION_KILLS[bug]
    k = 1 + sorted(VALIDATION_KILLS).index(bug) % 2  # K = 1 and 2, alternately
    events: list[Event] = []
    with pytest.raises(RunLeftTheModel):
        _serve(replace(run, bug=bug, spec_tokens=k), _plan_for(kind), events)
    clean: list[Event] = []
    _serve(replace(run, spec_tokens=k), _plan_for(kind), clean)  # validates: no bug, no exit
    assert events != clean
    assert any(e.action == "launch" for e in events) and mutations.mutations([bug])


def _serve_cpu(run: Run, plan: list[RequestPlan]) -> Outcome:
    """`plan` served on the cpu backend (the decoder's cpu twin), validated."""
    from ttmirror.conformance.validate import bounds_of, validate
    from ttmirror.impl.cpu_backend import CpuBackend
    from ttmirror.serving.backend import ServingBackend
    from ttmirror.serving.batching import ServingConfig, ServingEngine
    from ttmirror.serving.workload import run_workload

    from .test_async_serving import SAMPLINGS

    backend = ServingBackend(CpuBackend(), _model(run.model), SAMPLINGS[run.sampling])
    engine = ServingEngine(backend, ServingConfig(
        async_scheduling=run.async_scheduling, rows=ROWS, kv_tokens=run.kv_tokens,
        spec_tokens=run.spec_tokens))
    out = run_workload(engine, plan)
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None
    return out


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_traced_and_cpu_serving_with_drafts_equal_eager(sampling: str) -> None:
    """The decode step with drafts captured as traces (the lanes, verification and drafter
    replayed) and the decoder's cpu twin serve the eager tt run's tokens."""
    plan = standard_plan(_model("tiny-qwen3").vocab)
    run = Run("tiny-qwen3", sampling, spec_tokens=2)
    eager = _serve(run, plan)
    traced = _serve(replace(run, trace=True), plan)
    cpu = _serve_cpu(run, plan)
    assert traced.stats["trace_replays"] == traced.stats["launches"]
    assert drafted(cpu, 2, preempting=False) == []
    for other in (traced, cpu):
        assert other.tokens == eager.tokens and other.statuses == eager.statuses

"""The serving parity battery: async (depth 2) serving equals sync (depth 1), token for token.

One case per model: the probe, tiny Qwen3/Mistral/Llama built from seeded random weights, and
the real checkpoints when they are in the local Hugging Face cache (else SKIP, naming them).
Each case loads the engine with async scheduling on *auto* and first REQUIREs that it resolved
on with max_concurrent_batches() == 2: a case whose async path never engages fails, it never
skips. Then the same workload (staggered arrivals, different lengths, stop tokens, an abort, a
KV budget that forces preemption) runs at depth 2 and at depth 1 (async off), greedy and seeded,
on the emulated TT device with a seeded completion order and hazards raised; every scenario is
checked to have really happened, and the outputs must be equal per request.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache

import pytest

from ttmirror.conformance import bugs
from ttmirror.conformance.kills.serving_half import logprob_errors
from ttmirror.conformance.lockstep import planted
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import Emulator, HazardError, SeededScheduler, open_device
from ttmirror.emulator.decoder import dram_bytes
from ttmirror.impl.backend import padded_rows
from ttmirror.impl.events import Event
from ttmirror.impl.probe import ProbeReference
from ttmirror.impl.runner import Status
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import (
    CHECKPOINTS,
    TINY,
    CheckpointUnavailable,
    DecoderModel,
    ProbeDecoder,
    load_model,
)
from ttmirror.serving.row_order import POLICIES
from ttmirror.serving.workload import Outcome, RequestPlan, run_workload, standard_plan

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DRAM = 16 << 20
ROWS = 6
KV_TOKENS = 24  # requests 1 and 2 alone outgrow it (see standard_plan): preemption is forced
SEED = 23
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(seed=SEED)}


class AsyncGateError(AssertionError):
    """The anti-vacuous gate: async scheduling did not engage."""


@cache
def _model(name: str) -> DecoderModel:
    return load_model(name)


@dataclass(frozen=True)
class Run:
    model: str
    sampling: str
    async_scheduling: str = "auto"
    guard: bool = True
    trace: bool = False
    preempt_policy: str = "keep"
    prefill_chunk: int | None = None
    kv_tokens: int | None = KV_TOKENS
    """None: no KV budget, so nothing is preempted."""
    max_step_tokens: int | None = None
    """The per-step token budget that chunks prefills (None: none)."""
    max_logprobs: int = 0
    """Above 0: the engine allocates the logprob ring (requests may ask up to this many)."""
    bug: str | None = None
    """A bug planted in the run's runner and mirror (`conformance/planted.py`)."""
    row_order: str = "by-id"
    """Where each request's row lands in a step (`serving/row_order.py`)."""
    spec_tokens: int = 0
    """Drafts per decoding row (speculative decoding, spec rule 13); 0: none."""
    subsets: bool = False
    """The engine's scheduler takes vLLM's freedoms (spec rule 14) under its token budget."""
    state: str = "ring"
    """Where in-flight tokens live on the device (spec rule 14): the ring or state rows."""


def _require_async(enabled: bool, batches: int) -> None:
    """REQUIRE(async_scheduling_enabled()); REQUIRE(max_concurrent_batches() == 2)."""
    if not enabled:
        raise AsyncGateError(
            f"async scheduling resolved OFF (max_concurrent_batches={batches}): the depth-2 "
            "path never engages"
        )
    if batches != 2:
        raise AsyncGateError(f"max_concurrent_batches() is {batches}")


def _serve(run: Run, plan: list[RequestPlan], events: list[Event] | None = None) -> Outcome:
    """Serve `plan` once (`events`, if given, receives the runner's recorded events)."""
    model = _model(run.model)
    dram = DRAM + dram_bytes(model, padded_rows(ROWS), ROWS)  # checkpoints: large vocabularies
    device = open_device(
        num_command_queues=2,
        trace_region_size=1 << 20,
        emulator=Emulator(
            scheduler=lambda: SeededScheduler(SEED), hazard_mode="raise", dram_size=dram
        ),
        emulated=True,
    )
    tt = device.api
    try:
        backend = ServingBackend(TtBackend(device), model, SAMPLINGS[run.sampling])
        engine = ServingEngine(
            backend,
            ServingConfig(
                async_scheduling=run.async_scheduling,
                rows=ROWS,
                kv_tokens=run.kv_tokens,
                guard=run.guard,
                trace=run.trace,
                preempt_policy=run.preempt_policy,
                prefill_chunk=run.prefill_chunk,
                max_step_tokens=run.max_step_tokens,
                max_logprobs=run.max_logprobs,
                overrides=planted.overrides([run.bug]),
                row_order=run.row_order,
                spec_tokens=run.spec_tokens,
                subsets=run.subsets,
                state=run.state,
            ),
        )
        try:
            try:
                outcome = run_workload(engine, plan)
            except Exception as error:
                # Where the run left the model says more than where it fell over: check first.
                _validated(engine.runner.events.events, cause=error)
                raise
            finally:
                if events is not None:
                    events.extend(engine.runner.events.events)
            _validated(engine.runner.events.events)
            # What the engine resolved at load: the gate reads these.
            outcome.stats["async_enabled"] = engine.async_scheduling_enabled()
            outcome.stats["depth"] = engine.max_concurrent_batches()
            outcome.stats["hazards"] = device.hazards.total
        finally:
            engine.close()
    finally:
        tt.close_mesh_device(device)
    return outcome


VALIDATE = True
"""Every run's recorded events are checked as model transitions. A test-only switch: the twin
`test_twin_validation_is_what_kills_a_slot_released_early` turns it off."""


class RunLeftTheModel(AssertionError):
    """A run's recorded events are not a behaviour of the model (`ttmirror validate`)."""


def _validated(events: list[Event], cause: BaseException | None = None) -> None:
    """The run, event by event, is a behaviour of the model (`ttmirror validate`)."""
    if VALIDATE:
        d = validate(events, bounds_of(events))
        if d is not None:
            raise RunLeftTheModel(d.line()) from cause


_runs: dict[Run, Outcome] = {}


def _outcome(run: Run, gate: bool = False) -> Outcome:
    if run not in _runs:
        _runs[run] = _serve(run, standard_plan(_model(run.model).vocab))
    out = _runs[run]
    if gate:
        _require_async(out.stats["async_enabled"], out.stats["depth"])
    return out


MODELS = ["probe", *TINY]


def _order(model: str, *case: object) -> str:
    """The row-order policy of a battery case: rotated over the cases (the model and the other
    parameters, by their place in their lists), so that every scenario meets several policies,
    by id among them."""
    place = MODELS.index(model) if model in MODELS else 0
    place += sum(CASE_PLACES.get(c, 0) for c in case)
    return POLICIES[place % len(POLICIES)]


CASE_PLACES: dict[object, int] = {
    "seeded": 1, "drop": 2, "chunked": 1, "host-sync": 2, "per-request": 3, "penalties": 1,
    "constrained": 2, "logprobs": 3, "min-tokens": 1, True: 1,
}
"""A case parameter's shift of the rotation (others: 0)."""


def _check_scenario(out: Outcome, plan: list[RequestPlan], depth: int,
                    policy: str = "keep", preempting: bool = True,
                    budget: int = KV_TOKENS, order: str = "by-id") -> None:
    """Each scenario of the workload really happened (a run that skipped one proves nothing)."""
    s = out.stats
    assert s["depth"] == depth
    assert s["hazards"] == 0
    # The row order really was the policy's: by id, no step off id order; reversed and shuffled,
    # steps off id order at depth 2 (condense leaves id order only when a hole is filled past
    # its neighbour); and rows read from the mirror really moved between consecutive steps
    # (where the previous-row map matters).
    off_id_order = s.get("engine_steps_out_of_id_order", 0)
    if order == "by-id":
        assert off_id_order == 0, off_id_order
    elif depth == 2:
        # Condense keeps each request in its row until a hole opens before it: a run whose
        # requests all leave from the end moves none (the rotation gives every scenario
        # reversed and shuffled cases too, where rows always move).
        assert off_id_order > 0 or order == "condense", f"{order}: every step kept id order"
        assert s.get("row_moves", 0) > 0 or order == "condense", (
            f"{order}: no row read from the mirror moved")
    assert out.stopped(plan), "no request finished on a stop token"
    assert s["aborted_requests"] and all(
        out.statuses[r] == Status.ABORTED for r in s["aborted_requests"]
    ), "no abort happened"
    if not preempting:
        assert s["kv_preemptions"] == 0, "a run without a KV budget preempted"
    else:
        assert s["kv_preemptions"] >= 1 and s["kv_resumes"] >= 1, (
            "the KV budget forced no preemption")
        assert s["kv_peak_tokens"] <= budget
        # Resumed from the host's token list (its device row was gone), and went on generating.
        assert s["resumed_and_progressed"], "no preempted request generated after its resume"
    assert len({p.arrival for p in plan}) > 1 and len({p.max_tokens for p in plan}) > 1
    assert all(out.statuses[p.req] in (Status.FINISHED, Status.ABORTED) for p in plan)
    if depth == 2:
        # The pipeline really ran two deep, rows really came from the mirror, and events really
        # hit steps in flight.
        assert s["overlapped_launches"] >= s["launches"] // 2
        assert s["mirror_rows"] > 0
        assert s.get("abort_in_flight", 0) + s.get("finish_in_flight", 0) >= 1
        if not preempting:
            return
        assert s.get("preempt_in_flight", 0) >= 1
        if policy == "keep":  # a preempted request's in-flight token really was delivered
            assert s.get("preempted_delivered", 0) >= 1
        else:  # ... or really was dropped
            assert s.get("preempted_delivered", 0) == 0 and s.get("dropped_rows", 0) >= 1


def _parity_case(model: str, sampling: str, async_scheduling: str = "auto",
                 policy: str = "keep", bug: str | None = None, order: str | None = None) -> None:
    plan = standard_plan(_model(model).vocab)
    order = order or _order(model, sampling, policy)
    depth2 = _outcome(Run(model, sampling, async_scheduling, preempt_policy=policy, bug=bug,
                          row_order=order), gate=True)
    depth1 = _outcome(Run(model, sampling, "off", preempt_policy=policy, bug=bug,
                          row_order=order))
    _check_scenario(depth2, plan, depth=2, policy=policy, order=order)
    _check_scenario(depth1, plan, depth=1, policy=policy, order=order)
    for p in plan:
        assert depth2.tokens[p.req] == depth1.tokens[p.req], f"request {p.req} differs"
    assert depth2.statuses == depth1.statuses


# --- the battery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity(model: str, sampling: str) -> None:
    _parity_case(model, sampling)


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_when_preemption_drops(model: str, sampling: str) -> None:
    # The other legal policy: tokens in flight at a preemption are recomputed after the resume.
    _parity_case(model, sampling, policy="drop")


CHUNK = 2
"""Prompt tokens per prefill chunk: every prompt of the standard plan longer than this is split."""


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_with_chunked_prefill(model: str, sampling: str) -> None:
    plan = standard_plan(_model(model).vocab)
    order = _order(model, sampling, "chunked")
    depth2 = _outcome(Run(model, sampling, prefill_chunk=CHUNK, row_order=order), gate=True)
    depth1 = _outcome(Run(model, sampling, "off", prefill_chunk=CHUNK, row_order=order))
    _check_scenario(depth2, plan, depth=2, order=order)
    _check_scenario(depth1, plan, depth=1, order=order)
    # Chunks were really prefilled, and one beside a row decoding from the mirror.
    assert depth2.stats["kv_partial_chunks"] > 0 and depth2.stats["kv_chunks_beside_mirror"] > 0
    assert depth2.stats["partial_rows"] > 0
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    # Chunking changes when tokens come, not which: the same tokens as one-step prefill.
    assert depth2.tokens == _outcome(Run(model, sampling, "off")).tokens


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_with_a_host_sync_request(model: str, sampling: str) -> None:
    # Request 1 needs its newest token on the host before each step (as a structured-output
    # mask does): it takes no depth-2 step, while the others still overlap.
    plan = [replace(p, host_sync=p.req == 1) for p in standard_plan(_model(model).vocab)]
    depth2, depth1 = _both_depths(model, sampling, plan, "host-sync")
    assert depth2.stats["host_sync_held"] > 0, "the host-sync request was never held back"
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses


def _both_depths(model: str, sampling: str, plan: list[RequestPlan], case: str
                 ) -> tuple[Outcome, Outcome]:
    """`plan` served at depth 2 and at depth 1 with the case's row order; async really engaged
    and every scenario of the workload occurred in both."""
    order = _order(model, sampling, case)
    depth2 = _serve(Run(model, sampling, row_order=order), plan)
    depth1 = _serve(Run(model, sampling, "off", row_order=order), plan)
    _require_async(depth2.stats["async_enabled"], depth2.stats["depth"])
    _check_scenario(depth2, plan, depth=2, order=order)
    _check_scenario(depth1, plan, depth=1, order=order)
    return depth2, depth1


MIXED = (SamplingParams(), SamplingParams(seed=SEED + 11, top_k=4, temperature=0.7),
         SamplingParams(seed=SEED + 12, top_k=16, top_p=0.5),
         SamplingParams(seed=SEED + 13, top_k=2))
"""Per-request sampling, by request id modulo 4: greedy, and three seeded settings, each with its
own seed (its draws keyed by that seed and the position alone). The seeds are ones under which
every scenario of the workload occurs on every model (`_check_scenario` requires it)."""


@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_with_per_request_sampling(model: str) -> None:
    # Greedy and sampled requests in one batch: each row draws with its request's parameters,
    # keyed by (request, position), wherever the request sits.
    base = standard_plan(_model(model).vocab)
    plan = [replace(p, sampling=MIXED[p.req % len(MIXED)]) for p in base]
    order = _order(model, "per-request")
    depth2 = _serve(Run(model, "seeded", row_order=order), plan)
    depth1 = _serve(Run(model, "seeded", "off", row_order=order), plan)
    _require_async(depth2.stats["async_enabled"], depth2.stats["depth"])
    _check_scenario(depth2, plan, depth=2, order=order)
    _check_scenario(depth1, plan, depth=1, order=order)
    assert depth2.stats["kv_mixed_sampling_steps"] > 0, "no step mixed sampling parameters"
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    # The parameters really matter: the engine's one setting serves other tokens.
    assert depth2.tokens != _outcome(Run(model, "seeded", "off")).tokens


MIN_TOKENS = 3


def _constrained(p: RequestPlan, sampling: str) -> RequestPlan:
    """Stop requests get min_tokens; the others repetition and presence, or frequency,
    penalties."""
    base = SAMPLINGS[sampling]
    if p.stop_ids:
        return replace(p, sampling=replace(base, min_tokens=MIN_TOKENS))
    if p.req % 2:
        return replace(p, sampling=replace(base, repetition_penalty=1.5, presence_penalty=50.0))
    return replace(p, sampling=replace(base, frequency_penalty=50.0))


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_with_penalties_and_min_tokens(model: str, sampling: str) -> None:
    # Penalties read the request's output from the device-resident context, the newest token
    # included (it reached the context through the combine): no host read of the sampled ids.
    base = standard_plan(_model(model).vocab)
    plan = [_constrained(p, sampling) for p in base]
    depth2, depth1 = _both_depths(model, sampling, plan, "penalties")
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    free = _outcome(Run(model, sampling, "off")).tokens
    # min_tokens held: no stop id among a request's first MIN_TOKENS tokens, and without it some
    # request did stop that early (the mask really changed something).
    stopping = [p for p in plan if p.stop_ids]
    assert all(not set(depth2.tokens[p.req][:MIN_TOKENS]) & p.stop_ids for p in stopping)
    assert any(set(free[p.req][:MIN_TOKENS]) & p.stop_ids for p in stopping)
    # The penalties changed some penalised request's tokens, and (strong enough to outweigh any
    # logit) no penalised request repeated an id it had generated.
    assert any(depth2.tokens[p.req] != free[p.req] for p in plan if not p.stop_ids)
    assert all(len(set(depth2.tokens[p.req])) == len(depth2.tokens[p.req])
               for p in plan if not p.stop_ids)


BIASED, BANNED_AFTER = 17, 2
"""The id a request's logit bias pushes to every position, and how many free tokens a bad-words
request's ban is built from."""


def _masked(p: RequestPlan, sampling: str, free: list[int]) -> RequestPlan:
    """vLLM's allowed_token_ids (req % 4 == 0), logit_bias (1), bad_words (2: the first token of
    its free run, and its second and third as a two-id word) and min_p (3); stop requests keep
    the engine's sampling (their stops are scenarios of the workload)."""
    base = SAMPLINGS[sampling]
    if p.stop_ids:
        return p
    kind = p.req % 4
    if kind == 0:
        return replace(p, sampling=replace(base, allowed_ids=frozenset(range(8, 16))))
    if kind == 1:
        return replace(p, sampling=replace(base, logit_bias=((BIASED, 100.0),)))
    if kind == 2:
        words = ((free[0],), tuple(free[1:1 + BANNED_AFTER]))
        return replace(p, sampling=replace(base, bad_words=words))
    return replace(p, sampling=replace(base, min_p=0.5))


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", "tiny-qwen3"])
def test_async_serving_parity_with_biases_and_masks(model: str, sampling: str) -> None:
    # vLLM's logit_bias, allowed_token_ids, bad_words and min_p, applied by the decoder op on
    # the device from per-row tables (bad words read the device-resident context): async
    # equals sync, and each one really acted.
    free = _outcome(Run(model, sampling, "off")).tokens
    base = standard_plan(_model(model).vocab)
    plan = [_masked(p, sampling, free[p.req]) for p in base]
    depth2, depth1 = _both_depths(model, sampling, plan, "masks")
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    for p in plan:
        got, s = depth2.tokens[p.req], p.sampling
        if s is None or not got:
            continue
        if s.allowed_ids is not None:
            assert set(got) <= s.allowed_ids, p.req
        if s.logit_bias:
            assert set(got) == {BIASED}, p.req
        if s.bad_words:
            (single,), pair = s.bad_words
            assert single not in got and pair not in list(itertools.pairwise(got)), p.req
            assert got != free[p.req]
    # min_p: a greedy draw is unchanged; a sampled one keeps only ids near the most likely.
    tops = [p for p in plan if p.sampling is not None and p.sampling.min_p]
    if sampling == "greedy":
        assert all(depth2.tokens[p.req] == free[p.req] for p in tops)
    else:
        assert any(depth2.tokens[p.req] != free[p.req] for p in tops)


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_async_serving_parity_with_a_constrained_request(model: str, sampling: str) -> None:
    # Requests 1 and 3 follow a grammar whose mask the host builds from their tokens: they are
    # held back while a step of theirs is in flight, and every token obeys the grammar.
    plan = [replace(p, constraint="alternating-parity" if p.req in (1, 3) else None)
            for p in standard_plan(_model(model).vocab)]
    depth2, depth1 = _both_depths(model, sampling, plan, "constrained")
    assert depth2.stats["kv_constrained_rows"] > 0 and depth2.stats["host_sync_held"] > 0
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    for p in plan:
        if p.constraint:
            seq = [p.prompt[-1], *depth2.tokens[p.req]]
            assert all(a % 2 != b % 2 for a, b in itertools.pairwise(seq)), p.req
    free = _outcome(Run(model, sampling, "off")).tokens
    assert any(depth2.tokens[r] != free[r] for r in (1, 3))  # the mask really acted


def test_a_constrained_request_without_host_sync_is_caught() -> None:
    # Twin: with host sync unguarded, a constrained request is scheduled with a step in flight
    # and its mask would miss its newest token; the engine refuses to build it.
    plan = [replace(p, constraint="alternating-parity" if p.req == 1 else None)
            for p in standard_plan(_model("probe").vocab)]
    with pytest.raises(RunLeftTheModel) as caught:
        _serve(Run("probe", "greedy", bug="host-sync-unguarded"), plan)
    # Caught twice: the run had left the model at that schedule, and the engine refused the mask.
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "in flight" in str(caught.value.__cause__)


def test_a_sampled_request_on_a_greedy_engine_is_refused() -> None:
    from ttmirror.serving.batching import InvalidRequest

    with pytest.raises(InvalidRequest, match="engine loaded greedy"):
        _serve(Run("probe", "greedy"), [replace(standard_plan(_model("probe").vocab)[0],
                                                 sampling=MIXED[1])])


def test_both_preemption_policies_serve_the_same_tokens() -> None:
    keep = _outcome(Run("probe", "greedy", "off")).tokens
    assert keep == _outcome(Run("probe", "greedy", "off", preempt_policy="drop")).tokens


@pytest.fixture(params=sorted(CHECKPOINTS))
def checkpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    try:
        _model(name)
    except CheckpointUnavailable as e:
        pytest.skip(str(e))
    yield name


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
def test_async_serving_parity_checkpoint(checkpoint: str, sampling: str) -> None:
    _parity_case(checkpoint, sampling)


# --- the gate and the comparison can fail --------------------------------------------------------


@pytest.mark.parametrize("model", ["probe", "tiny-qwen3"])
def test_gate_fails_when_async_is_forced_off(model: str) -> None:
    with pytest.raises(AsyncGateError, match="resolved OFF"):
        _parity_case(model, "greedy", async_scheduling="off")


def test_probe_matches_its_reference() -> None:
    """Greedy probe tokens are a known function of (token, position): any stale id shows."""
    model = _model("probe")
    assert isinstance(model, ProbeDecoder)
    reference = ProbeReference(model.spec)
    out = _outcome(Run("probe", "greedy"), gate=True)
    for p in standard_plan(model.vocab):
        want = reference.sequence(p.prompt[-1], p.max_tokens)
        got = out.tokens[p.req]
        assert got == want[: len(got)]
        if out.statuses[p.req] == Status.FINISHED and len(got) < p.max_tokens:
            assert got[-1] in p.stop_ids


def test_guard_off_breaks_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin: without the stale-host-ids guard, placeholders reach the model and tokens change;
    the run also leaves the model (its guard-off twin) at the first combine of a placeholder."""
    plan = standard_plan(_model("tiny-llama").vocab)
    off = Run("tiny-llama", "greedy", guard=False)
    with pytest.raises(RunLeftTheModel, match="StaleHostIdsGuard"):
        _serve(off, plan)
    monkeypatch.setattr(sys.modules[__name__], "VALIDATE", False)  # to see the tokens too
    bad = _serve(off, plan)
    _require_async(bad.stats["async_enabled"], bad.stats["depth"])
    good = _outcome(Run("tiny-llama", "greedy", "off"))
    assert any(bad.tokens[p.req] != good.tokens[p.req] for p in plan)


def test_traced_depth2_matches_depth1() -> None:
    """The decode step captured as traces at load and replayed: same tokens as eager depth 1."""
    plan = standard_plan(_model("probe").vocab)
    traced = _outcome(Run("probe", "seeded", trace=True), gate=True)
    _check_scenario(traced, plan, depth=2)
    assert traced.stats["trace_replays"] == traced.stats["launches"]
    assert traced.tokens == _outcome(Run("probe", "seeded", "off")).tokens


@pytest.mark.parametrize("model", ["probe", *TINY])
def test_seeded_sampling_really_samples(model: str) -> None:
    """The seeded cases are not greedy in disguise: some request's tokens differ."""
    seeded = _outcome(Run(model, "seeded", "off")).tokens
    greedy = _outcome(Run(model, "greedy", "off")).tokens
    assert seeded != greedy


def test_tiny_architectures_are_distinct_models() -> None:
    """Three cases, three functions: no two tiny architectures serve the same tokens."""
    served = [_outcome(Run(name, "greedy", "off")).tokens for name in TINY]
    assert all(a != b for i, a in enumerate(served) for b in served[i + 1 :])


# --- vLLM's matrix: preemption x chunked prefill x sampling variant, on every model -----------

VARIANTS = ("greedy", "seeded", "per-request", "penalties", "logprobs", "min-tokens",
            "constrained")
STEP_TOKENS = ROWS
"""The matrix's chunked prefill: a per-step token budget of one token per row, so a prompt
arriving beside decoding rows is cut into chunks of what they leave."""
LOGPROBS = 3
MATRIX_KV_TOKENS = 20
"""The matrix's KV budget: tighter than the battery's, as chunked prefill under the step budget
spreads prompts over more steps, and the requests that must meet over budget meet later."""


def _with_logprobs(p: RequestPlan) -> RequestPlan:
    """Odd requests sample with their own seed, every fourth one greedy, both with logprobs."""
    if p.req % 2:
        return replace(p, sampling=replace(MIXED[p.req % len(MIXED)], logprobs=LOGPROBS))
    if p.req % 4 == 0:
        return replace(p, sampling=SamplingParams(logprobs=LOGPROBS))
    return p


def _variant_plan(variant: str, vocab: int) -> tuple[str, list[RequestPlan]]:
    """The engine's sampler and the plan for one sampling variant of the standard workload."""
    plan = standard_plan(vocab)
    if variant in ("greedy", "seeded"):
        return variant, plan
    if variant == "per-request":
        return "seeded", [replace(p, sampling=MIXED[p.req % len(MIXED)]) for p in plan]
    if variant == "penalties":
        return "seeded", [p if p.stop_ids else _constrained(p, "seeded") for p in plan]
    if variant == "logprobs":
        return "seeded", [_with_logprobs(p) for p in plan]
    if variant == "min-tokens":
        return "greedy", [_constrained(p, "greedy") if p.stop_ids else p for p in plan]
    return "greedy", [replace(p, constraint="alternating-parity" if p.req in (1, 3) else None)
                      for p in plan]


def _check_logprobs(out: Outcome, plan: list[RequestPlan], model: DecoderModel,
                    greedy_engine: bool) -> None:
    """The logprobs describe the tokens delivered: each equal to the model's own log-softmax
    over the request's context at that token, recomputed on the host, so a logprob of another
    row, step or request shows (`conformance.serving.logprob_errors`)."""
    assert out.logprobs and sum(len(v) for v in out.logprobs.values()) > 0
    assert logprob_errors(out, plan, model, greedy_engine) == []


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk", [None, STEP_TOKENS], ids=["one-step-prefill", "chunked"])
@pytest.mark.parametrize("budget", [MATRIX_KV_TOKENS, None], ids=["preempting", "no-preemption"])
@pytest.mark.parametrize("model", ["probe", *TINY])
def test_parity_matrix(model: str, budget: int | None, chunk: int | None, variant: str) -> None:
    sampling, plan = _variant_plan(variant, _model(model).vocab)
    lp = LOGPROBS if variant == "logprobs" else 0
    order = _order(model, variant, chunk is None, budget is None)
    runs = [Run(model, sampling, mode, max_step_tokens=chunk, kv_tokens=budget, max_logprobs=lp,
                row_order=order) for mode in ("auto", "off")]
    depth2, depth1 = (_serve(run, plan) for run in runs)
    _require_async(depth2.stats["async_enabled"], depth2.stats["depth"])
    for out, depth in ((depth2, 2), (depth1, 1)):
        _check_scenario(out, plan, depth=depth, preempting=budget is not None,
                        budget=budget or KV_TOKENS, order=order)
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    assert depth2.logprobs == depth1.logprobs  # logprob for logprob (both empty without them)
    s = depth2.stats
    if chunk is not None:
        # The budget really cut prefills into chunks, one beside a row decoding from the mirror,
        # and no step computed more tokens than it allows.
        assert s["kv_budget_cut_chunks"] > 0 and s["kv_chunks_beside_mirror"] > 0
        assert s["kv_peak_step_tokens"] <= chunk
    if variant == "per-request":
        assert s["kv_mixed_sampling_steps"] > 0
    if variant == "penalties":
        assert all(len(set(depth2.tokens[p.req])) == len(depth2.tokens[p.req])
                   for p in plan if p.sampling is not None)
    if variant == "logprobs":
        _check_logprobs(depth2, plan, _model(model), greedy_engine=False)
        # Logprobs were read back for a step while the next one was on the device.
        assert s["overlapped_launches"] > 0
    if variant == "min-tokens":
        assert all(not set(depth2.tokens[p.req][:MIN_TOKENS]) & p.stop_ids
                   for p in plan if p.stop_ids)
    if variant == "constrained":
        assert s["kv_constrained_rows"] > 0 and s["host_sync_held"] > 0
        for p in plan:
            if p.constraint:
                seq = [p.prompt[-1], *depth2.tokens[p.req]]
                assert all(a % 2 != b % 2 for a, b in itertools.pairwise(seq))


# --- logprobs, per-request seeds and the step's token budget, on their own ---------------------


@pytest.mark.parametrize("trace", [False, True], ids=["eager", "traced"])
def test_greedy_logprobs_name_the_argmax_and_match_the_model(trace: bool) -> None:
    # On the argmax path every logprob request's token is its own top entry; traced, the
    # logprob program replays into the ring's logprob part like the rest of the step.
    plan = [replace(p, sampling=SamplingParams(logprobs=LOGPROBS)) if p.req % 2 else p
            for p in standard_plan(_model("probe").vocab)]
    depth2 = _serve(Run("probe", "greedy", trace=trace, max_logprobs=LOGPROBS), plan)
    depth1 = _serve(Run("probe", "greedy", "off", max_logprobs=LOGPROBS), plan)
    _require_async(depth2.stats["async_enabled"], depth2.stats["depth"])
    _check_scenario(depth2, plan, depth=2)
    _check_logprobs(depth2, plan, _model("probe"), greedy_engine=True)
    assert depth2.tokens == depth1.tokens and depth2.logprobs == depth1.logprobs
    if trace:
        assert depth2.stats["trace_replays"] == depth2.stats["launches"]


def test_twin_logprobs_copied_after_the_event_are_a_hazard() -> None:
    # Planted: the logprob ring's copy is enqueued after the ids' event, so synchronising that
    # event does not cover it; reading it is the unsynchronised-readback hazard, raised.
    from ttmirror.emulator import HazardError

    plan = [_with_logprobs(p) for p in standard_plan(_model("probe").vocab)]
    with pytest.raises(HazardError, match="unsynchronised-readback"):
        _serve(Run("probe", "seeded", max_logprobs=LOGPROBS, bug="logprobs-after-event"), plan)


def test_a_request_asking_more_logprobs_than_the_engine_serves_is_refused() -> None:
    from ttmirror.serving.batching import InvalidRequest

    p = replace(standard_plan(_model("probe").vocab)[0], sampling=SamplingParams(logprobs=4))
    with pytest.raises(InvalidRequest, match=r"logprobs=4; this engine serves 0 to 3"):
        _serve(Run("probe", "greedy", max_logprobs=3), [p])
    with pytest.raises(InvalidRequest, match=r"logprobs=4; this engine serves 0 to 0"):
        _serve(Run("probe", "greedy"), [p])


@pytest.mark.parametrize("model", ["probe", *TINY])
def test_a_request_seed_makes_its_tokens_reproducible(model: str) -> None:
    # Requests 8 and 9 share a prompt and a seed but arrive apart, so they sit in other rows and
    # other steps (and one may be preempted): the same tokens. Request 10 differs only in its
    # seed: other tokens. The draw is keyed by (seed, position), not by the request's id.
    vocab = _model(model).vocab
    own = SamplingParams(seed=SEED + 100, top_k=32, temperature=1.5)
    prompt = tuple((5 * j + 3) % vocab for j in range(4))
    extra = [RequestPlan(8, 3, prompt, 10, sampling=own),
             RequestPlan(9, 8, prompt, 10, sampling=own),
             RequestPlan(10, 8, prompt, 10, sampling=replace(own, seed=SEED + 101))]
    plan = standard_plan(vocab) + extra
    depth2 = _serve(Run(model, "seeded"), plan)
    depth1 = _serve(Run(model, "seeded", "off"), plan)
    _require_async(depth2.stats["async_enabled"], depth2.stats["depth"])
    assert depth2.tokens == depth1.tokens and depth2.statuses == depth1.statuses
    assert depth2.stats["kv_preemptions"] >= 1
    assert len(depth2.tokens[8]) == 10 and depth2.tokens[8] == depth2.tokens[9]
    assert depth2.tokens[10] != depth2.tokens[8]


def test_the_step_token_budget_is_checked_at_load() -> None:
    with pytest.raises(ValueError, match=r"max_step_tokens \(5\) must be at least rows \(6\)"):
        _serve(Run("probe", "greedy", max_step_tokens=5), standard_plan(_model("probe").vocab))



# --- validation: what the recorded events alone kill ---------------------------------------------

HOST_SYNC_PLAN = "host-sync"
VALIDATION_KILLS: dict[str, tuple[Run, str | None]] = {
    bug: (Run("probe", "greedy"), None)
    for bug in ("guard-off", "prev-row-not-remapped", "prev-row-skips-dropped", "release-at-issue",
                "release-when-draining", "deliver-dropped", "stale-host-id-on-resume",
                "prev-row-two-back")
} | {
    "partial-prefill-feeds-mirror": (Run("probe", "greedy", prefill_chunk=CHUNK), None),
    "host-sync-unguarded": (Run("probe", "greedy"), HOST_SYNC_PLAN),
    # (tt) The mirror reports the host's wait on each readback event and its read of the copy:
    # a read before the wait leaves the model, on a chip too, where no hazard detector runs.
    "host-read-before-event": (Run("probe", "greedy"), None),
    # Right while rows keep id order: only a policy that reorders them shows it.
    "prev-row-by-id-rank": (Run("probe", "greedy", row_order="reversed"), None),
}
"""Planted bugs that occur in the serving loop, with a run where they do: the run's recorded
events leave the model, whatever its tokens."""
UNREACHABLE_IN_THE_LOOP = ("release-under-combine", "combine-before-launch",
                           "resume-with-placeholder")
"""Planted bugs the serving loop's phase order never reaches (the engine combines right after
scheduling, launches before the next schedule, and resumes only once nothing is owed): the
lockstep, which chooses every order, kills them (`ttmirror mutants`)."""


def _plan_for(kind: str | None) -> list[RequestPlan]:
    plan = standard_plan(_model("probe").vocab)
    return [replace(p, host_sync=p.req == 1) for p in plan] if kind == HOST_SYNC_PLAN else plan


def test_every_runner_bug_is_either_killed_by_validation_or_unreachable_in_the_loop() -> None:
    # The data bugs (tt) change what the device computes, not the protocol's events: the
    # battery's token comparison and the hazard checks kill those.
    # The spec-decode bugs need drafts: `test_the_spec_decode_battery_kills_...` below. Rule
    # 14's need the scheduler's freedoms under a tight budget (`SUBSETS_KILLS`); state rows are
    # the lockstep's (the serving loop keeps the ring).
    runner_bugs = set(bugs.BUGS) - bugs.TT_ONLY - bugs.SPEC_BUGS - bugs.ROWS_BUGS
    assert set(VALIDATION_KILLS).isdisjoint(UNREACHABLE_IN_THE_LOOP)
    assert runner_bugs <= set(VALIDATION_KILLS) | set(UNREACHABLE_IN_THE_LOOP) | set(
        SUBSETS_KILLS)


SUBSETS_KILLS: dict[str, Run] = {
    # The combine stages the first row's draft count for every row: a row the budget of 4 cut
    # to none of its drafts beside a first row with both is verified with two, and yields more
    # than it was scheduled (in the async run; the sync run of this plan survives it).
    "draft-count-of-another-row": Run("probe", "greedy", kv_tokens=None, max_step_tokens=4,
                                      spec_tokens=2, subsets=True),
    # A request the budget left out of the previous step is read from that step's slot at the
    # row it had in the step before.
    "skipped-from-previous-step": Run("probe", "greedy", kv_tokens=None, max_step_tokens=3,
                                      subsets=True),
}
"""Rule 14's planted bugs, with a run of the engine's own scheduler where they occur."""


@pytest.mark.parametrize("bug", sorted(SUBSETS_KILLS))
def test_the_engines_own_scheduler_reaches_rule_14s_bugs(bug: str) -> None:
    run = SUBSETS_KILLS[bug]
    with pytest.raises(RunLeftTheModel):
        _serve(replace(run, bug=bug), _plan_for(None))
    _serve(run, _plan_for(None))  # without it the same run validates


@pytest.mark.parametrize("bug", sorted(VALIDATION_KILLS))
def test_validation_alone_kills_each_serving_loop_bug(bug: str) -> None:
    run, kind = VALIDATION_KILLS[bug]
    events: list[Event] = []
    with pytest.raises(RunLeftTheModel):
        _serve(replace(run, bug=bug), _plan_for(kind), events)
    # Non-vacuous: the bug really changed the run (the same run without it validates).
    clean: list[Event] = []
    _serve(run, _plan_for(kind), clean)
    assert events != clean


@pytest.mark.parametrize("bug", UNREACHABLE_IN_THE_LOOP)
def test_a_bug_the_loop_cannot_reach_leaves_its_runs_unchanged(bug: str) -> None:
    for run in (Run("probe", "greedy"), Run("probe", "greedy", prefill_chunk=CHUNK)):
        on: list[Event] = []
        off: list[Event] = []
        _serve(replace(run, bug=bug), _plan_for(None), on)
        _serve(run, _plan_for(None), off)
        assert on == off


def test_twin_validation_is_what_kills_a_slot_released_early(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin: `release-when-draining` hands a slot back while its readback is still in flight.
    Nothing here rewrites the slot before the copy lands (on a chip its memory could be), so the
    tokens agree with depth 1 and every scenario happens: with validation switched off the
    battery's case passes; with it on, the run leaves the model at that release."""
    bug = "release-when-draining"
    monkeypatch.setattr(sys.modules[__name__], "VALIDATE", False)
    _parity_case("probe", "greedy", bug=bug)  # passes: the tokens cannot show it
    monkeypatch.setattr(sys.modules[__name__], "VALIDATE", True)
    _runs.clear()  # the runs above were cached unvalidated
    with pytest.raises(RunLeftTheModel, match=r"release\(\d+,\)\): not enabled"):
        _parity_case("probe", "greedy", bug=bug)


def test_the_battery_kills_a_previous_row_map_that_assumes_id_order() -> None:
    """Twin of the row-order policies: `prev-row-by-id-rank` takes a request's rank by id among
    the previous step's rows as its row. By id, that is its row: the battery's by-id case passes
    with it planted. Under every policy that moves rows off id order, the case fails."""
    bug = "prev-row-by-id-rank"
    _parity_case("probe", "greedy", bug=bug, order="by-id")  # passes: rows keep id order
    for order in ("reversed", "shuffle"):
        with pytest.raises(RunLeftTheModel, match="prev_rows"):
            _parity_case("probe", "greedy", bug=bug, order=order)


# --- the spec-decode matrix (spec rule 13): serving with drafts -------------------------------
#
# The parity battery's spec-decode matrix (spec rule 13): serving with drafts.
#
# Each cell serves one workload three times on the emulated TT device: async with K drafts per
# decoding row, sync with K drafts, and sync without drafts. Drafts change how many tokens a step
# delivers, never which: greedy verification is exact, and seeded verification draws each lane
# with plain decoding's draw at (request, position), so it is rejection sampling for the
# deterministic drafter, coupled to plain decoding's draws. So the three runs agree token for
# token, status for status and logprob for logprob, greedy and seeded. The one exception is an
# abort: the workload aborts a request once it has received N tokens, and with drafts the apply
# that crosses N may carry up to K more, so an aborted request's tokens agree up to the shorter
# run and each run got N to N + K of them.
#
# Every cell crosses several scenarios of the battery (preemption keep and drop, chunked prefill
# under a token budget, aborts, per-request sampling, penalties and min_tokens, logprobs, a
# constrained host-sync request) on the probe and the three tiny architectures, and checks that
# each really occurred, as `_check_scenario` does, plus what drafts add: every accepted count
# 0..K came back from the device, a preemption hit a row carrying drafts in flight, re-entering
# rows went without drafts (validation compares every row's drafts with the model's), a stop
# token inside an accepted run cut it. Every run validates against the model with drafts.

SPEC_KV = 20
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


def _cell_runs(model: str, cell: Cell, order: str) -> list[Run]:
    """Async with drafts, sync with drafts, sync without."""
    k = _k(cell, model)
    budget = ROWS * (1 + k) if cell.chunked else None  # a decoding row takes 1 + K tokens
    lp = LOGPROBS if cell.plan == "logprobs" else 0
    return [Run(model, cell.sampling, mode, preempt_policy=cell.policy, kv_tokens=SPEC_KV,
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
                         for i, run in enumerate(_cell_runs(model, c, order)))
    _require_async(fast.stats["async_enabled"], fast.stats["depth"])
    for out, depth in ((fast, 2), (slow, 1), (plain, 1)):
        _check_scenario(out, plan, depth=depth, policy=c.policy, budget=SPEC_KV, order=order)
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


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_stop_inside_an_accepted_run_cuts_it(mode: str) -> None:
    # A stop token came back inside a run of accepted tokens: the request finished at it, its
    # run cut there, as plain decoding stops.
    plan = standard_plan(_model("probe").vocab)
    out = _serve(Run("probe", "greedy", mode, spec_tokens=2), plan)
    assert out.stats.get("stops_inside_run", 0) > 0
    assert agree(out, _outcome(Run("probe", "greedy", "off")), plan, 2) == []
    assert out.stopped(plan)


@pytest.mark.parametrize("model", ["probe", sorted(TINY)[0]])
def test_the_engines_own_scheduler_takes_vllms_freedoms(model: str) -> None:
    # Rule 14 from the engine's own scheduler: under a budget of 7 tokens a step holds what
    # fits, decoding rows first with as many drafts as are left (1 + 2 each: the third gets none),
    # the rest left out;
    # request 8 runs into the model's context, where its rows carry fewer drafts. Async with
    # drafts equals sync with drafts equals sync without, and every run validates.
    vocab, context = _model(model).vocab, _model(model).max_context
    long = tuple((3 * j + 1) % vocab for j in range(context - 16))
    plan = [*standard_plan(vocab), RequestPlan(8, 2, long, 16)]  # its last token at the limit
    runs = [Run(model, "greedy", mode, kv_tokens=None, max_step_tokens=7, spec_tokens=k,
                subsets=True) for mode, k in (("auto", 2), ("off", 2), ("off", 0))]
    fast, slow, plain = (_serve(run, plan) for run in runs)
    _require_async(fast.stats["async_enabled"], fast.stats["depth"])
    assert agree(fast, slow, plan, 2) == [], "async with drafts != sync with drafts"
    assert agree(slow, plain, plan, 2) == [], "sync with drafts != sync without"
    s = fast.stats
    # It happened: rows left out (one while its own step was in flight), drafts cut by the
    # budget and by the context, a row with none beside one with all; no step over budget.
    assert s["kv_left_out_rows"] > 0 and s["skipped_in_flight"] > 0
    assert s["kv_budget_trimmed_drafts"] > 0 and s["kv_context_trimmed_drafts"] > 0
    assert s["fewer_drafts"] > 0 and s["none_beside_all"] > 0
    assert s["kv_peak_step_tokens"] <= 7


@pytest.mark.parametrize("model", ["probe", sorted(TINY)[0]])
def test_serving_on_state_rows_equals_the_ring(model: str) -> None:
    # The serving engine on per-request state rows (rule 14), its scheduler taking the freedoms
    # under a budget, with drafts and a KV budget that preempts: the tokens of the ring's sync
    # run, every run validating with state rows, and closed requests' rows reused.
    plan = standard_plan(_model(model).vocab)
    base = Run(model, "greedy", max_step_tokens=4, spec_tokens=2, subsets=True)
    events: list[Event] = []
    rows = _serve(replace(base, state="rows"), plan, events)
    ring = _serve(replace(base, async_scheduling="off"), plan)
    _require_async(rows.stats["async_enabled"], rows.stats["depth"])
    assert agree(rows, ring, plan, 2) == []
    assert rows.stats["state_rows"] == 2 * ROWS and rows.stats["mirror_rows"] > 0
    assert rows.stats["kv_preemptions"] > 0 and rows.stats["kv_left_out_rows"] > 0
    owners: dict[int, set[int]] = {}  # state row -> the requests its rows served
    for e in events:
        for row in e.get("rows") if e.action == "schedule" else ():
            owners.setdefault(row.idx, set()).add(row.req)
    assert any(len(reqs) > 1 for reqs in owners.values()), owners


# --- the checks of the matrix can fail -----------------------------------------------------------


def _made(tokens: dict[int, list[int]], aborted: int | None = None, **stats: int) -> Outcome:
    """An outcome with these tokens and stats, for the checks' own tests."""
    statuses = {r: Status.ABORTED if r == aborted else Status.FINISHED for r in tokens}
    return Outcome(tokens=tokens, statuses=statuses, iterations=0, seconds=0.0, stats=stats)


def test_the_agreement_fails_on_a_token_a_status_or_an_abort_too_late() -> None:
    plan = [RequestPlan(0, 0, (1,), 4), RequestPlan(1, 0, (1,), 6, abort_after=3)]
    base = _made({0: [5, 6, 7, 8], 1: [1, 2, 3]}, aborted=1)
    assert agree(base, _made({0: [5, 6, 7, 8], 1: [1, 2, 3, 4, 9]}, aborted=1), plan, 2) == []
    assert agree(base, _made({0: [5, 6, 7, 9], 1: [1, 2, 3]}, aborted=1), plan, 2)
    assert agree(base, _made({0: [5, 6, 7, 8], 1: [1, 2, 3]}), plan, 2)  # status
    assert agree(base, _made({0: [5, 6, 7, 8], 1: [1, 2, 4, 4]}, aborted=1), plan, 2)
    assert agree(base, _made({0: [5, 6, 7, 8], 1: [1, 2, 3, 4, 5, 6]}, aborted=1), plan, 2)


def test_the_scenario_check_of_drafts_fails_where_a_count_never_came_back() -> None:
    full = dict(accepted_0=3, accepted_1=2, accepted_2=1, drafted_rows=6, mirror_rows=4,
                preempt_with_drafts_in_flight=1, resumed_prefills=1)
    assert drafted(_made({}, **full), 2) == []
    for missing in full:
        assert drafted(_made({}, **{k: v for k, v in full.items() if k != missing}), 2)


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
    assert any(e.action == "launch" for e in events) and planted.overrides([bug])


def _serve_cpu(run: Run, plan: list[RequestPlan]) -> Outcome:
    """`plan` served on the cpu backend (the decoder's cpu twin), validated."""
    from ttmirror.impl.cpu_backend import CpuBackend

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
    replayed) and the decoder's cpu twin serve the eager tt run's tokens (the probe: the
    matrix serves the tiny architectures eagerly)."""
    plan = standard_plan(_model("probe").vocab)
    run = Run("probe", sampling, spec_tokens=2)
    eager = _serve(run, plan)
    traced = _serve(replace(run, trace=True), plan)
    cpu = _serve_cpu(run, plan)
    assert traced.stats["trace_replays"] == traced.stats["launches"]
    assert drafted(cpu, 2, preempting=False) == []
    for other in (traced, cpu):
        assert other.tokens == eager.tokens and other.statuses == eager.statuses


# --- the planted spec-decode bugs in a serving run with drafts -----------------------------------

SPEC_BATTERY_KILLS: dict[str, type[BaseException] | None] = {
    "bonus-token-dropped": RunLeftTheModel,  # a count of a, not a + 1: the apply diverges
    "reentering-drafts-from-device": RunLeftTheModel,  # drafts scheduled for a re-entering row
    "draft-part-previous-slot": HazardError,  # written under the previous slot's readback
    "count-from-wrong-row": None,  # the tokens differ from plain decoding's
    "positions-advance-by-spec": None,
    "rejected-draft-delivered": None,
}
"""How a serving run with drafts kills each planted spec-decode bug: the run leaves the model,
the emulated device reports a hazard, or (None) the tokens differ from plain decoding's."""
SPEC_LOCKSTEP_ONLY = ("host-drafts-placeholder",)
"""Spec-decode bugs whose serving runs keep plain decoding's tokens: a placeholder draft is
rejected by verification, and greedy verification loses nothing by a wrong draft. Only the
lockstep's look at the draft lanes the combine wrote sees it (`ttmirror mutants`)."""


def test_every_spec_decode_bug_is_killed_by_serving_or_left_to_the_lockstep() -> None:
    assert set(SPEC_BATTERY_KILLS) | set(SPEC_LOCKSTEP_ONLY) == bugs.SPEC_BUGS
    assert set(SPEC_BATTERY_KILLS).isdisjoint(SPEC_LOCKSTEP_ONLY)


@pytest.mark.parametrize("bug", sorted(SPEC_BATTERY_KILLS))
def test_the_spec_decode_battery_kills_each_spec_decode_bug(bug: str) -> None:
    plan = standard_plan(_model("probe").vocab)
    run = Run("probe", "greedy", spec_tokens=2)
    plain = _outcome(Run("probe", "greedy", "off"))
    assert agree(_serve(run, plan), plain, plan, 2) == []  # twin: without the bug, it agrees
    expected = SPEC_BATTERY_KILLS[bug]
    if expected is not None:
        with pytest.raises(expected):
            _serve(replace(run, bug=bug), plan)
    else:
        assert agree(_serve(replace(run, bug=bug), plan), plain, plan, 2) != []


@pytest.mark.parametrize("bug", SPEC_LOCKSTEP_ONLY)
def test_a_spec_decode_bug_serving_cannot_see_keeps_plain_tokens(bug: str) -> None:
    """The twin of leaving it to the lockstep: the run with it planted validates, raises no
    hazard and serves plain decoding's tokens, yet drafts really ran (every count came back)."""
    plan = standard_plan(_model("probe").vocab)
    out = _serve(Run("probe", "greedy", spec_tokens=2, bug=bug), plan)
    assert agree(out, _outcome(Run("probe", "greedy", "off")), plan, 2) == []
    assert out.stats["hazards"] == 0 and out.stats.get("drafted_rows", 0) > 0

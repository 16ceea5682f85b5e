"""vLLM's own engine and scheduler drive the TT mirror (issue: a real client no one here wrote).

Per model (the probe and the three tiny architectures) one vLLM process serves every cell:
vLLM's `LLMEngine` with its `AsyncScheduler` (async) or `Scheduler` (sync) decides admission,
chunked prefill under `max_num_batched_tokens`, preemption under a small KV cache, stops and
aborts; the bridge's executor runs each step in a ttmirror worker on the emulated device. Each
cell checks that async equals sync token for token and status for status, that greedy tokens
are the model's own continuation, that every run's events are model transitions (`ttmirror
validate`), and that its scenario really occurred in vLLM's decisions (preemptions, partial
chunks, rows scheduled over placeholders, stops, aborts).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from ttmirror.conformance.traces.itf import read_events
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.impl.probe import ProbeReference
from ttmirror.serving.catalog import TINY_ARCHS
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import ProbeDecoder, load_model_dir, write_model_dir
from ttmirror.serving.workload import RequestPlan, standard_plan
from ttmirror.vllm_client import Cell, requests_of, serve

MODELS = ["probe", *TINY_ARCHS]
SCENARIOS: dict[str, dict[str, Any]] = {
    # Eight requests arriving over a dozen engine steps, stop sets, one aborted after 3 tokens.
    "plain": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "scale": 1},
    # Twice the lengths in a KV cache of 4 blocks of 16 tokens (one is vLLM's null block) for
    # 4 rows: vLLM preempts; a 6-token step budget beside the decodes: vLLM chunks prefills.
    "preempt-chunked": {"max_num_seqs": 4, "max_num_batched_tokens": 6, "num_gpu_blocks": 4,
                        "max_model_len": 48, "scale": 2},
    # The seeded sampler loaded; per request: greedy with logprobs, seeded top-k/top-p draws,
    # penalties with min_tokens, some with logprobs (`_sampled`).
    "sampling": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "scale": 1,
                 "sampler_seed": 0, "max_logprobs": 3},
    # Speculative decoding: vLLM schedules K drafts per decoding row (placeholders under async
    # scheduling), the worker drafts and verifies on the device; the plain workload with K = 2,
    # and the tight one with K = 1 (preemptions with drafts in flight, chunks beside drafts).
    "drafts": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "scale": 1, "spec_tokens": 2,
               "max_logprobs": 2},
    "drafts-preempt-chunked": {"max_num_seqs": 4, "max_num_batched_tokens": 12,
                               "num_gpu_blocks": 4, "max_model_len": 48, "scale": 2,
                               "spec_tokens": 1},
    # vLLM's scheduler freedoms (spec rule 14). An 8-token step budget for up to 8 rows that
    # want 1 + K = 3 tokens each: vLLM leaves running requests out of steps, their last step
    # still in flight under async scheduling.
    "drafts-budget": {"max_num_seqs": 8, "max_num_batched_tokens": 8, "scale": 1,
                      "spec_tokens": 2},
    # The same on per-request state rows (rule 14): the worker gathers each row's newest token,
    # position and drafts from its request's state row, wherever vLLM left it.
    "drafts-budget-rows": {"max_num_seqs": 8, "max_num_batched_tokens": 8, "scale": 1,
                           "spec_tokens": 2, "state": "rows"},
    # Requests asking for more than max_model_len = 16 holds (`_to_the_limit`): near the limit
    # vLLM schedules fewer drafts, none beside all in one step, and each stops at the limit.
    "drafts-context-limit": {"max_num_seqs": 4, "max_num_batched_tokens": 256,
                             "max_model_len": 16, "scale": 1, "spec_tokens": 2},
}
MODES = {"async": True, "sync": False}
GREEDY_SCENARIOS = ("plain", "preempt-chunked", "drafts", "drafts-preempt-chunked",
                    "drafts-budget", "drafts-budget-rows", "drafts-context-limit")


DRAFT_LOGPROBS = 3
"""Requests i % 3 == 0 of the drafts scenario ask for 2 logprobs: one entry per token, with rows
that deliver several tokens at once."""
UNSEEDED = 1
"""Requests i % 4 == UNSEEDED of the sampling scenario reach vLLM without a seed (its default):
the worker draws theirs from the engine's seeded stream."""


def _to_the_limit(p: RequestPlan) -> RequestPlan:
    """Request i of the context-limit scenario: 40 tokens asked, no stop, no abort."""
    return replace(p, max_tokens=40, stop_ids=frozenset(), abort_after=None)


def _sampled(p: RequestPlan) -> RequestPlan:
    """Request i of the sampling scenario: greedy with 2 logprobs (i % 4 == 0), draws without a
    seed of their own (1, `UNSEEDED`), seeded draws with 3 logprobs (2), greedy under penalties
    and min_tokens (3)."""
    kind = p.req % 4
    draws = {"seed": 100 + p.req, "top_k": 8, "top_p": 0.9, "temperature": 0.8}
    own = [SamplingParams(logprobs=2), SamplingParams(**draws),
           SamplingParams(**draws, logprobs=3),
           SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                          min_tokens=2)][kind]
    return replace(p, sampling=own)




@pytest.fixture(scope="module", params=MODELS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, Any]:
    name = request.param
    root = tmp_path_factory.mktemp(f"vllm-{name}")
    model_dir = str(root / "model")
    write_model_dir(name, model_dir)
    model = load_model_dir(model_dir)
    plans = {scenario: standard_plan(model.vocab, scale=sizes["scale"])
             for scenario, sizes in SCENARIOS.items()}
    plans["sampling"] = [_sampled(p) for p in plans["sampling"]]
    plans["drafts-context-limit"] = [_to_the_limit(p) for p in plans["drafts-context-limit"]]
    cells, keys = [], []
    for scenario, sizes in SCENARIOS.items():
        for mode, on in MODES.items():
            engine = {k: v for k, v in sizes.items() if k != "scale"}
            requests = requests_of(plans[scenario])
            for r in requests:
                if scenario == "sampling" and int(r["id"]) % 4 == UNSEEDED:
                    del r["seed"]
                if scenario == "drafts" and int(r["id"]) % DRAFT_LOGPROBS == 0:
                    r["logprobs"] = 2
            cells.append(Cell(model_dir=model_dir, async_scheduling=on, requests=requests,
                              **engine,
                              trace=str(root / f"{scenario}-{mode}.itf.json")))
            keys.append((scenario, mode))
    results = serve(cells, root)
    return {"name": name, "model": model, "plans": plans,
            "runs": dict(zip(keys, results, strict=True)),
            "traces": {k: c.trace for k, c in zip(keys, cells, strict=True)}}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_async_equals_sync_through_vllm(served: dict[str, Any], scenario: str) -> None:
    a, s = served["runs"][scenario, "async"], served["runs"][scenario, "sync"]
    # The gate, on vLLM's own config: async resolved ON at depth 2 with the TT mirror.
    assert a["async_scheduling"] and a["max_concurrent_batches"] == 2
    assert a["worker"]["stats"]["mirror_rows"] > 0  # rows combined on the device
    assert not s["async_scheduling"] and s["max_concurrent_batches"] == 1
    assert a["worker"]["failed"] is None and s["worker"]["failed"] is None
    assert a["tokens"] == s["tokens"]
    assert a["finish"] == s["finish"]
    assert a["logprobs"] == s["logprobs"]
    assert set(a["finish"]) == {str(p.req) for p in served["plans"][scenario]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_vllm_run_is_a_model_behaviour(served: dict[str, Any], scenario: str,
                                             mode: str) -> None:
    events = list(read_events(Path(served["traces"][scenario, mode])))
    d = validate(events, bounds_of(events))
    assert d is None, d.line()
    assert sum(e.action == "arrive" for e in events) == len(served["plans"][scenario])


def _greedy(model: Any, p: RequestPlan, n: int) -> list[int]:
    """The model's own greedy continuation of `p`'s prompt, `n` tokens."""
    if isinstance(model, ProbeDecoder):
        return ProbeReference(model.spec).sequence(p.prompt[-1], n)
    context = list(p.prompt)
    out = []
    for pos in range(n):
        token = int(torch.argmax(model.logits(torch.tensor(context), pos)))
        out.append(token)
        context.append(token)
    return out


@pytest.mark.parametrize("scenario", GREEDY_SCENARIOS)
def test_greedy_tokens_are_the_models_own(served: dict[str, Any], scenario: str) -> None:
    run = served["runs"][scenario, "async"]
    for p in served["plans"][scenario]:
        got = run["tokens"][str(p.req)]
        assert got == _greedy(served["model"], p, len(got)), p.req
        reason = run["finish"][str(p.req)]
        limit = SCENARIOS[scenario].get("max_model_len", 128) - len(p.prompt)
        if reason == "length":
            assert len(got) == min(p.max_tokens, limit)
        elif reason == "stop":
            assert got[-1] in p.stop_ids and not set(got[:-1]) & p.stop_ids
        else:
            assert reason == "abort" and p.abort_after is not None


def test_each_scenario_really_occurred(served: dict[str, Any]) -> None:
    runs = served["runs"]
    plain = runs["plain", "async"]
    assert "stop" in plain["finish"].values() and "abort" in plain["finish"].values()
    assert "abort" in plain["worker"]["closed_as"].values()
    assert "finish" in plain["worker"]["closed_as"].values()
    assert plain["worker"]["vllm"]["rows_over_placeholders"] > 0
    # The abort met the request's next step in flight: its row there was dropped, not delivered.
    assert plain["worker"]["stats"].get("abort_in_flight", 0) > 0, plain["worker"]["stats"]
    for mode in MODES:
        tight = runs["preempt-chunked", mode]
        decided = tight["worker"]["vllm"]
        assert decided["preemptions"] > 0 and decided["resumes"] > 0, decided
        assert decided["partial_chunks"] > 0, decided
        assert tight["worker"]["stats"]["preemptions"] == decided["preemptions"]
    tight = runs["preempt-chunked", "async"]["worker"]
    assert tight["vllm"]["rows_over_placeholders"] > 0


def test_sampling_penalties_and_logprobs_really_occurred(served: dict[str, Any]) -> None:
    run, model = served["runs"]["sampling", "async"], served["model"]
    plan = served["plans"]["sampling"]
    drawn = [p for p in plan if p.sampling is not None and not p.sampling.greedy]
    # Seeded draws left the greedy path somewhere: the sampler really sampled.
    assert any(run["tokens"][str(p.req)] != _greedy(model, p, len(run["tokens"][str(p.req)]))
               for p in drawn)
    for p in plan:
        got = run["tokens"][str(p.req)]
        asked = p.sampling.logprobs if p.sampling is not None else None
        if asked is None:
            assert str(p.req) not in run["logprobs"]
            continue
        rows = run["logprobs"][str(p.req)]
        assert len(rows) == len(got)  # one entry per delivered token
        for token, row in zip(got, rows, strict=True):
            assert token in [t for t, _, _ in row] and len(row) <= asked + 1
            if p.sampling.greedy:  # greedy: the sampled id is the most likely one
                assert min(r for t, _, r in row if t == token) == 1
        if p.sampling.greedy and not p.sampling.constrained():
            assert got == _greedy(model, p, len(got))
    penalised = [p for p in plan if p.sampling is not None and p.sampling.constrained()]
    assert penalised and all(len(run["tokens"][str(p.req)]) >= 1 for p in penalised)
    # Each request without a seed drew one at arrival, recorded, the same in async and sync
    # (whose tokens are equal: test_async_equals_sync_through_vllm); the draws really sampled.
    drawn_seeds = {}
    for mode in MODES:
        events = read_events(Path(served["traces"]["sampling", mode]))
        drawn_seeds[mode] = [e.get("seed") for e in events if e.action == "arrive"
                             and e.get("seed") is not None]
    unseeded = [p for p in plan if p.req % 4 == UNSEEDED]
    assert len(drawn_seeds["async"]) == len(unseeded) == len(set(drawn_seeds["async"]))
    assert drawn_seeds["async"] == drawn_seeds["sync"]
    assert any(run["tokens"][str(p.req)] != _greedy(model, p, len(run["tokens"][str(p.req)]))
               for p in unseeded)


def test_drafts_really_occurred(served: dict[str, Any]) -> None:
    """Every accepted count 0..K, rows drafted over placeholders under async scheduling, and a
    preemption with drafts in flight; at depth 1 the drafts vLLM scheduled were the worker's
    own (checked at every step: `ScheduledEngine` refuses any other)."""
    runs = served["runs"]
    for scenario in ("drafts", "drafts-preempt-chunked"):
        k = SCENARIOS[scenario]["spec_tokens"]
        for mode in MODES:
            stats = runs[scenario, mode]["worker"]["stats"]
            assert stats["drafted_rows"] > 0
            assert all(stats.get(f"accepted_{a}", 0) > 0 for a in range(k + 1)), stats
        assert runs[scenario, "async"]["worker"]["vllm"]["rows_over_placeholders"] > 0
    tight = runs["drafts-preempt-chunked", "async"]["worker"]
    assert tight["vllm"]["preemptions"] > 0 and tight["vllm"]["partial_chunks"] > 0
    assert tight["stats"].get("preempt_with_drafts_in_flight", 0) > 0, tight["stats"]


def test_logprobs_with_drafts_are_one_entry_per_token(served: dict[str, Any]) -> None:
    """Rows that accepted drafts deliver several tokens in one step; vLLM slices their logprobs
    per token: each request that asked has one entry per token, the token itself among them at
    rank 1 (greedy), and async's are sync's (test_async_equals_sync_through_vllm)."""
    run = served["runs"]["drafts", "async"]
    asked = [p for p in served["plans"]["drafts"] if p.req % DRAFT_LOGPROBS == 0]
    assert asked
    for p in asked:
        got, rows = run["tokens"][str(p.req)], run["logprobs"][str(p.req)]
        assert len(rows) == len(got) > 0
        for token, row in zip(got, rows, strict=True):
            assert min(rank for t, _, rank in row if t == token) == 1
            assert len(row) <= 3  # the sampled id and the top 2
    others = {str(p.req) for p in served["plans"]["drafts"]} - {str(p.req) for p in asked}
    assert not others & set(run["logprobs"])
    assert all(run["worker"]["stats"].get(f"accepted_{a}", 0) > 0 for a in (1, 2))


def test_vllms_scheduler_freedoms_really_occurred(served: dict[str, Any]) -> None:
    """Spec rule 14, in vLLM's own decisions and the runner's count of the plans it executed:
    under a tight budget vLLM left running requests out of steps while a step of theirs was in
    flight; near max_model_len it scheduled decoding rows with fewer drafts than they had, and
    one with none beside one with all K; every request of that scenario stopped at the limit.
    The runs serve to completion, async equals sync, and their events validate (the tests
    above)."""
    runs = served["runs"]
    for scenario in ("drafts-budget", "drafts-budget-rows"):
        budget = runs[scenario, "async"]["worker"]
        assert budget["stats"].get("skipped_in_flight", 0) > 0, budget["stats"]
        assert budget["vllm"]["skipped_in_flight"] > 0, budget["vllm"]
    # On state rows: the worker's table held a row per request, and rows read the device.
    rows = runs["drafts-budget-rows", "async"]["worker"]["stats"]
    assert rows.get("state_rows", 0) > 0 and rows.get("mirror_rows", 0) > 0, rows
    for mode in MODES:
        limit = runs["drafts-context-limit", mode]
        stats, decided = limit["worker"]["stats"], limit["worker"]["vllm"]
        assert stats.get("fewer_drafts", 0) > 0 and decided["fewer_drafts"] > 0, decided
        assert stats.get("none_beside_all", 0) > 0 and decided["none_beside_all"] > 0, decided
        assert set(limit["finish"].values()) == {"length"}


"""`ScheduledEngine` serves a foreign plan the model allows; what it does not allow fails the
request it concerns alone, in one line, and the others go on."""

from __future__ import annotations

import pytest

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.runner import Status
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.scheduled import NewRequest, Plan, ScheduledEngine


def _engine() -> ScheduledEngine:
    return ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder()),
                           ServingConfig(async_scheduling="off", rows=4))


def _two_arrive(engine: ScheduledEngine) -> None:
    engine.launch(Plan(rows=(0, 1), tokens={0: 3, 1: 2}, computed={0: 0, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 4), NewRequest(1, (4, 5), 4))))
    got = engine.collect()
    assert set(got.tokens) == {0, 1} and all(len(t) == 1 for t in got.tokens.values())


def test_a_plan_the_model_allows_is_served() -> None:
    engine = _engine()
    _two_arrive(engine)
    engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3, 1: 2}))
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {0: 1, 1: 1}


@pytest.mark.parametrize(("plan", "refused", "why"), [
    (Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 4, 1: 2}), 0, "the plan says 4 tokens"),
    (Plan(rows=(0, 1), tokens={0: 2, 1: 1}, computed={0: 3, 1: 2}), 0, "decodes 2 tokens"),
    (Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3, 1: 2}, spec={0: (-1,)}), 0,
     "has 0 draft(s)"),
])
def test_a_plan_the_model_forbids_fails_that_request_alone(plan: Plan, refused: int,
                                                          why: str) -> None:
    """The request the plan gets wrong is aborted with the reason (recorded in its abort
    event); the step goes on with the other, which is delivered its token; a later plan that
    still names the refused request (its scheduler has not heard yet) leaves it out; the run's
    events validate."""
    engine = _engine()
    _two_arrive(engine)
    other = 1 - refused
    step = engine.launch(plan)
    assert step >= 0
    got = engine.take_refused()
    assert list(got) == [refused] and why in got[refused]
    assert engine.runner.status(refused) == Status.ABORTED
    (abort,) = [e for e in engine.runner.events.events if e.action == "abort"]
    assert abort.args == (refused,) and why in abort.get("reason")
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {other: 1}
    # The scheduler plans the refused request once more before it hears: left out.
    computed = 3 if other == 0 else 2
    engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 1},
                       computed={other: computed + 1, refused: 99}))
    assert engine.take_refused() == {}
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {other: 1}
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_step_may_leave_a_running_request_out(mode: str) -> None:
    """vLLM's token budget leaves running requests out of a step (spec rule 14): the step runs
    the others, the skipped request's next step takes its newest token where it lives, and the
    tokens are those of the steps that hold every request."""
    def serve(skip: bool) -> dict[int, list[int]]:
        engine = ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder()),
                                 ServingConfig(async_scheduling=mode, rows=4))
        out: dict[int, list[int]] = {0: [], 1: []}
        computed = {0: 0, 1: 0}
        prompt = {0: 3, 1: 2}
        plans = [(0, 1), (0,), (1,), (0, 1), (1, 0), (0, 1), (1,)] if skip else [(0, 1)] * 5
        in_flight = 0
        for i, rows in enumerate(plans):
            rows = tuple(r for r in rows if computed[r] < prompt[r] + 3)  # 4 tokens each
            if not rows:
                continue
            new = (NewRequest(0, (1, 2, 3), 4), NewRequest(1, (4, 5), 4)) if i == 0 else ()
            tokens = {r: (prompt[r] if i == 0 else 1) for r in rows}
            engine.launch(Plan(rows=rows, tokens=tokens, computed=dict(computed), new=new))
            assert engine.take_refused() == {}
            for r in rows:
                computed[r] += tokens[r]
            in_flight += 1
            if in_flight >= engine.runner.depth:
                for r, got in engine.collect().tokens.items():
                    out[r] += got
                in_flight -= 1
        for _ in range(in_flight):
            for r, got in engine.collect().tokens.items():
                out[r] += got
        events = engine.runner.events.events
        assert validate(events, bounds_of(events)) is None
        if skip:  # a step without request 0 while its step was in flight, at depth 2
            scheduled = [e.args for e in events if e.action == "schedule"]
            assert (1,) in scheduled and (0,) in scheduled
        return out

    every = serve(skip=False)
    assert every == serve(skip=True)
    assert all(len(t) == 4 for t in every.values())


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_decoding_row_may_carry_fewer_drafts(mode: str) -> None:
    """Near max_model_len vLLM schedules fewer drafts on a row, none included (rule 14): the
    row verifies what it carries, and greedy tokens are those with every draft. The plans count
    computed tokens as vLLM's do: every scheduled token at once, the rejected drafts taken back
    when their step's output arrives."""
    def serve(counts: list[int]) -> list[int]:
        engine = ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder()),
                                 ServingConfig(async_scheduling=mode, rows=4, spec_tokens=2))
        tokens: list[int] = []
        computed = 0
        flight: list[int] = []  # drafts of each step in flight

        def collect() -> None:
            nonlocal computed
            got = engine.collect().tokens[0]
            tokens.extend(got)
            d = flight.pop(0)
            computed -= d + 1 - len(got) if d else 0  # the rejected drafts, taken back

        for i, d in enumerate([0, *counts]):
            if i == 0:
                plan = Plan(rows=(0,), tokens={0: 3}, computed={0: 0},
                            new=(NewRequest(0, (1, 2, 3), 16),))
            else:
                held = engine.host_drafts().get(0, ()) if not flight else (-1, -1)
                plan = Plan(rows=(0,), tokens={0: 1 + d}, computed={0: computed},
                            spec={0: tuple(held[:d])} if d else {})
            engine.launch(plan)
            assert engine.take_refused() == {}, (i, d)
            computed += plan.tokens[0]
            flight.append(d)
            if len(flight) >= engine.runner.depth:
                collect()
        while flight:
            collect()
        events = engine.runner.events.events
        assert validate(events, bounds_of(events)) is None
        return tokens

    every = serve([2, 2, 2, 2])
    fewer = serve([1, 0, 2, 1])
    n = min(len(every), len(fewer))
    assert n >= 5 and every[:n] == fewer[:n]


def test_an_arrival_the_engine_cannot_serve_is_refused_alone() -> None:
    """A request asking for what the mirror does not serve never arrives: it is recorded as
    refused, with the reason, and the other arrival of the same step is served."""
    engine = _engine()
    engine.launch(Plan(rows=(0, 1), tokens={0: 3, 1: 2}, computed={0: 0, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 4),
                            NewRequest(1, (4, 5), 4, refuse="request 1: no min_p here"))))
    assert engine.take_refused() == {1: "request 1: no min_p here"}
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {0: 1}
    refuse = [e for e in engine.runner.events.events if e.action == "refuse"]
    assert [(e.args, e.get("reason")) for e in refuse] == [((1,), "request 1: no min_p here")]
    assert 1 not in engine.runner.requests
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None


def _sampled_engine(seed: int) -> ScheduledEngine:
    return ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder(), SamplingParams(seed=seed)),
                           ServingConfig(async_scheduling="off", rows=4))


def _serve_unseeded(seed: int) -> tuple[list[int], dict[int, list[int]]]:
    """Two sampled requests without seeds of their own, served for 6 tokens: the seeds their
    arrive events record, and their tokens."""
    engine = _sampled_engine(seed)
    sampled = SamplingParams(top_k=64, top_p=1.0, temperature=1.0)
    engine.launch(Plan(rows=(0, 1), tokens={0: 3, 1: 2}, computed={0: 0, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 8, sampling=sampled, draw_seed=True),
                            NewRequest(1, (4, 5), 8, sampling=sampled, draw_seed=True))))
    tokens = {q: list(t) for q, t in engine.collect().tokens.items()}
    for n in range(5):
        engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3 + n, 1: 2 + n}))
        for q, t in engine.collect().tokens.items():
            tokens[q] += t
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None
    return [e.get("seed") for e in events if e.action == "arrive"], tokens


def test_an_unseeded_sampled_request_draws_its_seed_from_the_engines_stream() -> None:
    """Each gets a seed of its own from the engine's seeded stream, in arrival order, recorded
    in its arrive event: the same engine seed replays the same seeds and tokens; another engine
    seed draws others."""
    seeds, tokens = _serve_unseeded(0)
    assert len(set(seeds)) == 2 and all(isinstance(s, int) for s in seeds)
    assert all(len(t) == 6 for t in tokens.values())
    assert _serve_unseeded(0) == (seeds, tokens)
    other_seeds, _ = _serve_unseeded(1)
    assert other_seeds != seeds


def test_a_greedy_engine_refuses_a_sampled_request_alone() -> None:
    engine = _engine()
    engine.launch(Plan(rows=(0, 1), tokens={0: 3, 1: 2}, computed={0: 0, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 4),
                            NewRequest(1, (4, 5), 4, sampling=SamplingParams(), draw_seed=True))))
    got = engine.take_refused()
    assert list(got) == [1] and "loaded greedy" in got[1]
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {0: 1}


def test_an_arrival_with_a_cached_prefix_prefills_only_the_rest() -> None:
    """vLLM's prefix cache: a request enters with 2 of its 3 prompt tokens computed and a
    1-token chunk; it is served, and its tokens are those of the same request computed whole."""
    def serve(cached: int) -> list[int]:
        engine = _engine()
        engine.launch(Plan(rows=(0,), tokens={0: 3 - cached}, computed={0: cached},
                           new=(NewRequest(0, (1, 2, 3), 4),)))
        assert engine.take_refused() == {}
        tokens = list(engine.collect().tokens[0])
        for n in range(3):
            engine.launch(Plan(rows=(0,), tokens={0: 1}, computed={0: 3 + n}))
            tokens += engine.collect().tokens[0]
        assert engine.kv.prefix_hits == (cached > 0)
        events = engine.runner.events.events
        assert validate(events, bounds_of(events)) is None
        return tokens

    assert serve(2) == serve(0) and len(serve(0)) == 4


def test_a_cached_prefix_covering_the_whole_context_is_refused_alone() -> None:
    engine = _engine()
    engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 2}, computed={0: 3, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 4), NewRequest(1, (4, 5), 4))))
    got = engine.take_refused()
    assert list(got) == [0] and "leaves at least one token" in got[0]
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {1: 1}


@pytest.mark.parametrize("mode", ["on", "off"])
def test_drafts_on_the_chunk_that_ends_a_prefill_go_unverified(mode: str) -> None:
    """vLLM resumes a request with the drafts it held, on the chunk that ends its prefill: the
    row prefills and samples its next token, the drafts count as rejected, and the next plans'
    computed counts (vLLM's: optimistic while the step is in flight, then taken back) agree."""
    engine = ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder()),
                             ServingConfig(async_scheduling=mode, rows=4, spec_tokens=1))
    engine.launch(Plan(rows=(0,), tokens={0: 4}, computed={0: 0}, spec={0: (5,)},
                       new=(NewRequest(0, (1, 2, 3), 8),)))
    assert engine.take_refused() == {} and engine.kv.drafts_on_prefill == 1
    if mode == "on":  # planned with the prefill in flight: its draft still counted computed
        engine.launch(Plan(rows=(0,), tokens={0: 2}, computed={0: 4}, spec={0: (-1,)}))
        assert engine.take_refused() == {}
        assert len(engine.collect().tokens[0]) == 1  # the prefill's one token
        assert len(engine.collect().tokens[0]) >= 1
    else:
        assert len(engine.collect().tokens[0]) == 1
        held = engine.host_drafts()[0]
        engine.launch(Plan(rows=(0,), tokens={0: 2}, computed={0: 3}, spec={0: held}))
        assert engine.take_refused() == {}
        assert len(engine.collect().tokens[0]) >= 1
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None


@pytest.mark.parametrize(("call", "op", "when"), [("op", "argmax", "launch"),
                                                  ("read", None, "launch"),
                                                  ("read", None, "collect")])
def test_a_device_fault_fails_its_steps_requests_alone(call: str, op: str | None,
                                                      when: str) -> None:
    """A fault in a step's launch (its argmax, its readback's copy) or a readback that never
    lands (the host gives up on it): the requests of that step fail with the device's error
    (`take_refused`, or the collect's `refused`), nothing of it is delivered, and the engine
    serves the next request; the run validates."""
    from ttmirror.conformance.kills.fault_half import STALL_S, TIMEOUT_S, open_emulated
    from ttmirror.impl.tt_backend import TtBackend

    device = open_emulated()
    try:
        engine = ScheduledEngine(ServingBackend(TtBackend(device), ProbeDecoder()),
                                 ServingConfig(async_scheduling="off", rows=4,
                                               readback_timeout_s=TIMEOUT_S))
        _two_arrive(engine)
        # The fault kinds' own stall (`fault_runs`: past the host's patience).
        device.faults.arm(call, op=op, stall_s=STALL_S if when == "collect" else None)
        step = engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3, 1: 2}))
        if when == "launch":
            assert step == -1
            failed = engine.take_refused()
        else:
            assert step >= 0 and engine.take_refused() == {}
            got = engine.collect()
            assert got.tokens == {0: [], 1: []}
            failed = got.refused
        assert sorted(failed) == [0, 1]
        assert all(why.startswith("device fault:") for why in failed.values())
        assert {engine.status(q) for q in (0, 1)} == {Status.FAILED}
        engine.launch(Plan(rows=(2,), tokens={2: 2}, computed={2: 0},
                           new=(NewRequest(2, (7, 8), 4),)))
        assert engine.take_refused() == {}
        assert {k: len(v) for k, v in engine.collect().tokens.items()} == {2: 1}
        events = engine.runner.events.events
        assert validate(events, bounds_of(events)) is None
    finally:
        engine.close()
        device.close()

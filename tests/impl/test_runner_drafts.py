"""The runner with drafts (spec rule 13) on the cpu backend: the mirror combines each row's
newest token, position and drafts on the device, the launch verifies, and async decoding with
drafts gives exactly the tokens of sync decoding with drafts and of plain decoding without."""

from __future__ import annotations

import pytest

from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.drafts import DraftSpec
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.runner import PhaseError, Runner, RunnerConfig, Status
from ttmirror.serving.engine import Engine, EngineConfig

PROMPTS = {0: 3, 1: 17, 2: 40, 3: 9, 4: 61}
LENGTHS = {0: 12, 1: 9, 2: 15, 3: 1, 4: 7}


def _serve(config: EngineConfig) -> tuple[Engine, dict[int, list[int]]]:
    """Serve PROMPTS with rows reversed every other step (the map must follow them)."""
    flip = [False]

    def order(rows: list[int]) -> list[int]:
        flip[0] = not flip[0]
        return rows[::-1] if flip[0] else rows

    engine = Engine(CpuBackend(), config, order=order)
    for req, prompt in PROMPTS.items():
        engine.submit(req, prompt, max_tokens=LENGTHS[req])
    engine.run()
    return engine, {req: engine.delivered(req) for req in PROMPTS}


@pytest.mark.parametrize("probe", [ProbeSpec(), ProbeSpec(sampling=5)], ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 2])
def test_async_with_drafts_equals_sync_with_drafts_equals_plain(probe: ProbeSpec, k: int) -> None:
    plain = ProbeReference(probe)
    expected = {req: plain.sequence(PROMPTS[req], LENGTHS[req], req) for req in PROMPTS}
    drafts = DraftSpec(k=k)
    runs = {}
    for mode in ("on", "off"):
        engine, tokens = _serve(EngineConfig(async_scheduling=mode, probe=probe, drafts=drafts))
        assert engine.max_concurrent_batches() == (2 if mode == "on" else 1)
        assert tokens == expected, mode
        runs[mode] = engine.runner.stats
    stats = runs["on"]
    # The situations really occurred: rows read newest token, position and drafts from the
    # device, every accepted count 0..K, rows moved, and fewer steps than tokens.
    assert stats["mirror_rows"] > 0 and stats["drafted_rows"] > 0
    assert all(stats[f"accepted_{a}"] > 0 for a in range(k + 1)), dict(stats)
    assert stats["row_moves"] > 0
    assert stats["launches"] < sum(LENGTHS.values())


@pytest.mark.parametrize("k", [1, 2])
def test_a_stop_token_inside_an_accepted_run_cuts_the_run_there(k: int) -> None:
    plain = ProbeReference(ProbeSpec())
    prompts = {req: (7 * req + 1) % 64 for req in range(16)}
    stops, expected = {}, {}
    for req, prompt in prompts.items():  # each stops at what would be its token 4 to 7
        seq = plain.sequence(prompt, 12, req)
        stops[req] = frozenset({seq[3 + req % 4]})
        at = next(i for i, t in enumerate(seq) if t in stops[req])
        expected[req] = seq[: at + 1]
    for mode in ("on", "off"):
        engine = Engine(CpuBackend(), EngineConfig(async_scheduling=mode, drafts=DraftSpec(k=k),
                                                   rows=16))
        for req, prompt in prompts.items():
            engine.submit(req, prompt, max_tokens=12, stop_ids=stops[req])
        engine.run()
        assert {req: engine.delivered(req) for req in prompts} == expected, mode
        if mode == "on":  # some stop really fell inside a run, before its newest token
            assert engine.runner.stats["stops_inside_run"] > 0


def test_without_a_draft_aware_combine_drafts_resolve_sync() -> None:
    from ttmirror.impl.tt_backend import TtBackend

    engine_config = EngineConfig(drafts=DraftSpec(k=1))
    with pytest.raises(ValueError, match="carries no drafts yet"):
        Engine(TtBackend(), engine_config)


def _pipeline(k: int = 1) -> Runner:
    """r0's prefill launched, and a step behind it whose row reads the mirror."""
    r = Runner(CpuBackend(), RunnerConfig(drafts=DraftSpec(k=k), max_tokens=8))
    r.allocate()
    r.arrive(0, 5)
    r.schedule()
    r.combine(0)
    r.launch(0)
    r.schedule()
    return r


def test_a_mirror_row_has_no_host_position_and_owes_one_plus_k() -> None:
    r = _pipeline()
    prefill, drafted = r.queue[0].rows[0], r.queue[1].rows[0]
    assert (prefill.spec, prefill.pos) == (0, 0)  # a new request carries no drafts
    assert (drafted.prev_row, drafted.spec, drafted.pos) == (0, 1, -1)
    assert r.owed(0) == 1 + 2
    r.combine(1)
    r.launch(1)
    for _ in range(2):
        r.readback_issue(0)
        r.readback_complete(0)
        r.apply()
    assert r.owed(0) == 0 and 2 <= len(r.requests[0].delivered) <= 3
    assert r.stats["drafted_rows"] == 1


def test_a_preempted_request_resumes_without_drafts_once_it_owes_nothing() -> None:
    r = _pipeline()
    r.preempt(0)
    assert r.stats["preempt_with_drafts_in_flight"] == 1
    r.readback_issue(0)
    r.readback_complete(0)
    r.apply()
    with pytest.raises(PhaseError, match="placeholder"):
        r.resume(0)  # the drafted row is still owed
    r.combine(0)
    r.launch(0)
    r.readback_issue(0)
    r.readback_complete(0)
    r.apply()
    r.resume(0)
    r.schedule()
    row = r.queue[0].rows[0]
    assert (row.spec, row.prev_row, row.drafts) == (0, None, ())
    assert row.pos == len(r.requests[0].delivered)
    assert r.requests[0].status == Status.RUNNING

"""The runner with drafts (spec rule 13) on the cpu and tt backends: the mirror combines each
row's newest token, position and drafts on the device, the launch verifies, and async decoding
with drafts gives exactly the tokens of sync decoding with drafts and of plain decoding without.
On tt (the emulated device, eager and traced) the mirror's device data also equal the cpu
mirror's step by step, with every call on a documented row."""

from __future__ import annotations

import random

import pytest
import torch
import ttnn

from ttmirror.emulator import EmulatedMeshDevice
from ttmirror.emulator.checker import recording
from ttmirror.impl.backend import Backend, MirrorSpec, StepInputs
from ttmirror.impl.cpu_backend import CpuBackend, CpuMirror
from ttmirror.impl.drafts import DraftSpec
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.rows import Row
from ttmirror.impl.runner import PhaseError, Runner, RunnerConfig, Status
from ttmirror.impl.tt_backend import TtBackend, TtMirror
from ttmirror.serving.engine import Engine, EngineConfig

PROMPTS = {0: 3, 1: 17, 2: 40, 3: 9, 4: 61}
LENGTHS = {0: 12, 1: 9, 2: 15, 3: 1, 4: 7}
PROBES = [ProbeSpec(), ProbeSpec(sampling=5)]
BACKENDS = ["cpu", "tt", "tt-traced"]


def _serve(backend: Backend, config: EngineConfig) -> tuple[Engine, dict[int, list[int]]]:
    """Serve PROMPTS with rows reversed every other step (the map must follow them)."""
    flip = [False]

    def order(rows: list[int]) -> list[int]:
        flip[0] = not flip[0]
        return rows[::-1] if flip[0] else rows

    engine = Engine(backend, config, order=order)
    try:
        for req, prompt in PROMPTS.items():
            engine.submit(req, prompt, max_tokens=LENGTHS[req])
        engine.run()
    finally:
        engine.close()
    return engine, {req: engine.delivered(req) for req in PROMPTS}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("probe", PROBES, ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 2])
def test_async_with_drafts_equals_sync_with_drafts_equals_plain(
        probe: ProbeSpec, k: int, backend: str, device: EmulatedMeshDevice) -> None:
    plain = ProbeReference(probe)
    expected = {req: plain.sequence(PROMPTS[req], LENGTHS[req], req) for req in PROMPTS}
    drafts = DraftSpec(k=k)
    runs = {}
    for mode in ("on", "off"):
        config = EngineConfig(async_scheduling=mode, probe=probe, drafts=drafts,
                              trace=backend == "tt-traced")
        engine, tokens = _serve(CpuBackend() if backend == "cpu" else TtBackend(device), config)
        assert engine.max_concurrent_batches() == (2 if mode == "on" else 1)
        assert tokens == expected, mode
        runs[mode] = engine.runner.stats
    assert device.hazards.total == 0
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


class IdsOnlyBackend(CpuBackend):
    """A backend that mirrors sampled ids but whose combine is not draft-aware."""

    name = "ids-only"

    def supports_draft_aware_combine(self) -> bool:
        return False


def test_without_a_draft_aware_combine_drafts_resolve_sync() -> None:
    engine, tokens = _serve(IdsOnlyBackend(), EngineConfig(drafts=DraftSpec(k=1)))
    assert engine.max_concurrent_batches() == 1  # auto: sync, and still drafting
    plain = ProbeReference(ProbeSpec())
    assert tokens == {req: plain.sequence(PROMPTS[req], LENGTHS[req], req) for req in PROMPTS}
    assert engine.runner.stats["drafted_rows"] > 0


def _values(tensor: ttnn.Tensor) -> list[int]:
    """A device tensor's values (the compute queue is idle: read after synchronising)."""
    tt = tensor.device().api
    return [int(v) for v in tt.to_torch(tt.from_device(tensor)).reshape(-1).tolist()]


def _rows(values: torch.Tensor) -> list[int]:
    return [int(v) for v in values.reshape(-1).tolist()]


@pytest.mark.parametrize("trace", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("probe", PROBES, ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 2])
def test_tt_mirror_device_data_equal_the_cpu_mirror_step_by_step(
        k: int, probe: ProbeSpec, trace: bool, device: EmulatedMeshDevice) -> None:
    """Rows shuffled every step, each scheduling 0..K drafts, a few re-entering from the host
    with host drafts: the input lanes, positions, and the slot's ids, target tokens, counts,
    positions and drafts are the cpu mirror's, and every call met a documented row."""
    api = device.api
    rows, slots, steps = 20, 2, 10
    spec = MirrorSpec(rows=rows, slots=slots, probe=probe, drafts=DraftSpec(k=k), trace=trace)
    with recording(device) as calls:  # a trace's calls are checked as it is captured, at load
        tt = TtBackend(device).open_mirror(spec)
    cpu = CpuMirror(MirrorSpec(rows=rows, slots=slots, probe=probe, drafts=DraftSpec(k=k)))
    assert isinstance(tt, TtMirror) and tt.verify is not None
    rng = random.Random(k * 10 + (probe.sampling or 0))
    order, previous = list(range(rows)), list(range(rows))
    seen: set[int] = set()
    try:
        with recording(device) as step_calls:
            for step in range(steps):
                slot = step % slots
                rng.shuffle(order)
                batch = []
                for r in order:
                    if step == 0 or rng.random() < 0.2:  # a host row: its id, position, drafts
                        spec_r = 0 if step == 0 else rng.randrange(k + 1)
                        drafts = tuple(rng.randrange(64) for _ in range(spec_r))
                        batch.append(Row(req=r, pos=4 * step, prev_row=None, host_pos=4 * step,
                                         host_id=rng.randrange(64), spec=spec_r, drafts=drafts))
                    else:
                        batch.append(Row(req=r, pos=-1, prev_row=previous.index(r),
                                         spec=rng.randrange(k + 1)))
                inputs = StepInputs(tuple(batch))
                for mirror in (tt, cpu):
                    mirror.stage(inputs)
                    mirror.combine(slot)
                    mirror.launch(slot)
                api.synchronize_device(device)
                got = {
                    "lanes": [_values(t)[:rows] for t in tt.combiner.lanes],
                    "base": _values(tt.combiner.base)[:rows],
                    "ids": _values(tt.ring[slot])[:rows],
                    "tokens": [_values(t)[:rows] for t in tt.ring.drafts[slot].tokens],
                    "counts": _values(tt.ring.drafts[slot].count)[:rows],
                    "positions": _values(tt.ring.drafts[slot].position)[:rows],
                    "drafts": [_values(t)[:rows] for t in tt.ring.drafts[slot].drafts],
                }
                want = {
                    "lanes": [_rows(lane)[:rows] for lane in cpu.input_lanes],
                    "base": _rows(cpu.input_positions)[:rows],
                    "ids": _rows(cpu.ring[slot])[:rows],
                    "tokens": [_rows(lane)[:rows] for lane in cpu.ring_tokens[slot]],
                    "counts": _rows(cpu.ring_counts[slot])[:rows],
                    "positions": _rows(cpu.ring_positions[slot])[:rows],
                    "drafts": [_rows(lane)[:rows] for lane in cpu.ring_drafts[slot]],
                }
                assert got == want, step
                pending, reference = tt.readback_issue(slot), cpu.readback_issue(slot)
                assert tt.readback_complete(pending) == cpu.readback_complete(reference)
                assert tt.readback_drafts(pending) == cpu.readback_drafts(reference), step
                previous = list(order)
                seen.update(got["counts"])
        assert bool(step_calls) is not trace  # replays run what the capture checked
        assert all(call.documented for call in [*calls, *step_calls])
        assert {"where", "eq", "gather", "argmax"} <= {c.op for c in [*calls, *step_calls]}
    finally:
        tt.close()
    assert seen == set(range(1, k + 2))  # every accepted count 0..K occurred
    assert device.hazards.total == 0


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

"""The acceptance run: 200+ decode steps at depth 2 on the emulated device, hazards raised,
delivered tokens equal to the depth-1 run and to the probe's reference, token for token.

Each variant runs once per module; the twins below prove the scenario really happened
(preemptions, aborts and stops hit in-flight steps, rows moved, mirror rows were combined) and
that the comparison can fail (with the guard off, stale host ids change the tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from ttmirror.conformance.rig import open_rig
from ttmirror.emulator import SeededScheduler
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.runner import Status
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.engine import Engine, EngineConfig

from .scenario import Outcome, expected, make_plan, run

SEED = 11
PROBE = ProbeSpec(seed=SEED)
REFERENCE = ProbeReference(PROBE)
PLAN = make_plan(SEED)
EXPECTED = expected(PLAN, REFERENCE)


@dataclass(frozen=True)
class Variant:
    backend: str = "tt"
    mode: str = "on"  # async_scheduling
    trace: bool = False
    guard: bool = True
    readback_cq: int | None = None  # None: CQ1 (the device has two)
    device_seed: int = SEED  # the emulated queues' completion order


@dataclass
class Result:
    outcome: Outcome
    hazards: int
    allocations_after_load: int | None
    depth: int


def _run(variant: Variant) -> Result:
    rng = random.Random(SEED)
    config = EngineConfig(
        async_scheduling=variant.mode, rows=8, probe=PROBE, trace=variant.trace, guard=variant.guard
    )
    order = lambda eligible: rng.sample(eligible, len(eligible))  # noqa: E731 - reorder each step
    if variant.backend == "cpu":
        engine = Engine(CpuBackend(), config, order)
        return Result(run(engine, PLAN, REFERENCE), 0, None, engine.max_concurrent_batches())
    device = open_rig("mirror", scheduler=lambda: SeededScheduler(variant.device_seed))
    tt = device.api
    try:
        engine = Engine(TtBackend(device, readback_cq=variant.readback_cq), config, order)
        serial_at_load = device.allocator.next_serial
        outcome = run(engine, PLAN, REFERENCE)
        allocations = device.allocator.next_serial - serial_at_load
        engine.close()
    finally:
        tt.close_mesh_device(device)
    return Result(outcome, device.hazards.total, allocations, engine.max_concurrent_batches())


_cache: dict[Variant, Result] = {}


def result(variant: Variant) -> Result:
    if variant not in _cache:
        _cache[variant] = _run(variant)
    return _cache[variant]


SYNC = Variant(mode="off")
ASYNC = Variant(mode="on")


def test_depth2_delivers_exactly_the_depth1_tokens_with_zero_hazards() -> None:
    sync, depth2 = result(SYNC), result(ASYNC)
    assert (sync.depth, depth2.depth) == (1, 2)
    assert depth2.outcome.stats["launches"] >= 200
    assert sync.hazards == depth2.hazards == 0  # raise mode: any hazard would have raised
    assert depth2.outcome.delivered == sync.outcome.delivered
    assert depth2.outcome.delivered == EXPECTED  # and both are the probe's reference


def test_twin_the_scenario_hit_every_in_flight_case() -> None:
    stats = result(ASYNC).outcome.stats
    for situation in (
        "preempt_in_flight",  # a preemption dropped a live in-flight row
        "abort_in_flight",
        "finish_in_flight",  # a stop token finished a request with its next step in flight
        "resumed_prefills",  # resumed requests restarted from host ids
        "row_moves",  # a request sat at different rows in consecutive steps
        "mirror_rows",  # rows combined from the previous slot on device
        "slot_reuses",
    ):
        assert stats.get(situation, 0) > 0, f"{situation} never happened: {stats}"
    statuses = set(result(ASYNC).outcome.statuses.values())
    assert {Status.FINISHED, Status.ABORTED} <= statuses


def test_twin_depth1_never_reads_the_mirror_and_never_overlaps() -> None:
    stats = result(SYNC).outcome.stats
    assert stats.get("mirror_rows", 0) == 0
    assert stats["host_decode_rows"] > 0
    assert stats.get("overlapped_launches", 0) == 0
    # Depth 2 keeps the pipeline full through every batch change: no drain.
    depth2 = result(ASYNC).outcome.stats
    assert depth2["overlapped_launches"] > 0.8 * depth2["launches"], depth2


def test_twin_without_the_guard_stale_host_ids_change_the_tokens() -> None:
    broken = result(Variant(mode="on", guard=False))
    assert broken.hazards == 0  # no memory hazard: the bug is in the ids, found by the tokens
    wrong = [r for r, tokens in broken.outcome.delivered.items() if tokens != EXPECTED[r]]
    assert len(wrong) > len(EXPECTED) // 2


def test_trace_mode_delivers_the_same_tokens_replaying_the_captured_steps() -> None:
    traced = result(Variant(mode="on", trace=True))
    stats = traced.outcome.stats
    assert traced.outcome.delivered == EXPECTED
    assert traced.hazards == 0  # includes trace-unsafe-allocation, raised at replay
    assert stats["trace_captures"] == 2  # one per ring slot, captured once at load
    assert stats["trace_replays"] == stats["launches"] >= 200  # every step is a replay
    assert traced.allocations_after_load == 0  # not one device allocation after capture


@pytest.mark.parametrize(
    "variant",
    [Variant(readback_cq=0), Variant(device_seed=SEED + 1), Variant(readback_cq=0, trace=True)],
    ids=["single-queue", "other-completion-order", "single-queue-traced"],
)
def test_other_queue_layouts_and_completion_orders_deliver_the_same_tokens(
    variant: Variant,
) -> None:
    other = result(variant)
    assert other.hazards == 0
    assert other.outcome.delivered == EXPECTED
    assert other.outcome.stats["readback_cq"] == (1 if variant.readback_cq is None else 0)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_cpu_backend_delivers_the_reference_tokens(mode: str) -> None:
    cpu = result(Variant(backend="cpu", mode=mode))
    assert cpu.depth == (2 if mode == "on" else 1)
    assert cpu.outcome.delivered == EXPECTED

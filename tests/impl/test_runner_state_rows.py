"""Per-request state rows on the device (spec rule 14), end to end on the runner: pipeline
batches at depth 3 and 4 (a request absent from the step after its own while that step is in
flight), subsets with and without drafts, a state row reused after its owner closed. The tokens
delivered are checked against the probe's reference sequence, on the cpu and on the emulated
device (eager with one and two queues, traced); and each test checks that the situation it is
about really occurred (a row combined from its state row, written by a step older than the
previous one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import EmulatedMeshDevice
from ttmirror.impl.backend import Backend
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.drafts import DraftSpec
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.runner import CLOSED, PhaseError, Runner, RunnerConfig
from ttmirror.impl.tt_backend import TtBackend

from .phases import retire_oldest

PROMPTS = {0: 3, 1: 5, 2: 11}
MAX_TOKENS = 9


def _release_closed_rows(runner: Runner) -> None:
    for idx, owner in enumerate(runner.table):
        if owner >= 0 and runner.status(owner) in CLOSED and runner.releasable_row(idx):
            runner.release_row(idx)


def _drive(runner: Runner, orders: Sequence[tuple[int, ...]],
           drafts: Callable[[Runner, tuple[int, ...]], tuple[int, ...] | None] | None = None
           ) -> None:
    """Each order is a step over the eligible requests it names (none left: skipped); the
    oldest step retires only when the depth is full, so steps overlap as far as they may."""
    for order in orders:
        if len(runner.queue) >= runner.depth:
            retire_oldest(runner)
        _release_closed_rows(runner)
        todo = tuple(r for r in order if r in runner.eligible())
        if not todo:
            continue
        q = runner.schedule(todo, drafts(runner, todo) if drafts else None)
        runner.combine(q)
        runner.launch(q)
    while runner.queue:
        retire_oldest(runner)


def _runner(backend: Backend, *, depth: int, k: int = 0, state_rows: int = 0,
            trace: bool = False) -> Runner:
    config = RunnerConfig(depth=depth, slots=depth, rows=4, max_tokens=MAX_TOKENS,
                          drafts=DraftSpec(k=k) if k else None, subsets=True, state="rows",
                          state_rows=state_rows, trace=trace)
    runner = Runner(backend, config)
    runner.allocate()
    return runner


def _backend(name: str, device: EmulatedMeshDevice) -> Backend:
    """The cpu, or the emulated device (seeded completion order, hazards raised) with the
    readback on its second queue or on the compute queue."""
    if name == "cpu":
        return CpuBackend()
    return TtBackend(device, readback_cq=1 if name == "tt-2cq" else 0)


# Three requests in pipeline batches: each step holds two of them, so a request is absent from
# the step after its own (and at depth 3 that step is in flight when its next row combines).
PIPELINE = [(0, 1), (1, 2), (2, 0), (0, 1), (1, 2), (2, 0)] * 6


def _check_reference(runner: Runner) -> None:
    """Every request got the probe's reference tokens, and the run's events are transitions of
    the model with state rows (its invariants checked after each), deciding what it decides."""
    ref = ProbeReference(ProbeSpec())
    for r, prompt in PROMPTS.items():
        got = runner.requests[r].delivered
        assert got == ref.sequence(prompt, MAX_TOKENS), f"request {r}"
    events = runner.events.events
    bounds = bounds_of(events)
    assert bounds.state == "rows" and bounds.subsets
    divergence = validate(events, bounds)
    assert divergence is None, divergence.line()


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("depth", [3, 4])
@pytest.mark.parametrize("name", ["cpu", "tt-2cq", "tt-1cq"])
def test_pipeline_batches_deliver_the_reference_sequence(
        name: str, depth: int, k: int, device: EmulatedMeshDevice) -> None:
    runner = _runner(_backend(name, device), depth=depth, k=k)
    for r, prompt in PROMPTS.items():
        runner.arrive(r, prompt)
    _drive(runner, PIPELINE)
    _check_reference(runner)
    # It really happened: rows combined from a state row that an older step than the previous
    # one wrote (the ring cannot reach those), and every row not from the host read the device.
    assert runner.stats["rows_from_older_step"] > 0
    assert runner.stats["mirror_rows"] > 0
    runner.close()


@pytest.mark.parametrize("name", ["cpu", "tt-2cq"])
def test_a_table_wider_than_the_batch(name: str, device: EmulatedMeshDevice) -> None:
    """40 state rows (64 on the device) behind a batch of 4 rows (32): the combine's gather
    takes the batch's width from its index, the post-update's the table's."""
    runner = _runner(_backend(name, device), depth=3, k=2, state_rows=40)
    for r, prompt in PROMPTS.items():
        runner.arrive(r, prompt)
    _drive(runner, PIPELINE)
    _check_reference(runner)
    assert runner.stats["rows_from_older_step"] > 0 and len(runner.table) == 40
    runner.close()


@pytest.mark.parametrize("k", [0, 2])
def test_traced_pipeline_batches_deliver_the_reference_sequence(
        k: int, tt: TtBackend) -> None:
    runner = _runner(tt, depth=3, k=k, trace=True)
    for r, prompt in PROMPTS.items():
        runner.arrive(r, prompt)
    _drive(runner, PIPELINE)
    _check_reference(runner)
    assert runner.stats["rows_from_older_step"] > 0
    assert runner.describe()["trace_replays"] == runner.stats["launches"]
    runner.close()


@pytest.mark.parametrize("name", ["cpu", "tt-2cq"])
def test_fewer_drafts_and_none_beside_all_with_state_rows(
        name: str, device: EmulatedMeshDevice) -> None:
    """Each decoding row carries a draft count of its own (d = 0 beside d = K included): the
    counts are data, and the tokens are the reference's whatever each row carries."""
    runner = _runner(_backend(name, device), depth=3, k=2)

    def drafts(r: Runner, order: tuple[int, ...]) -> tuple[int, ...]:
        due = [r.spec_due(x, r.requests[x].prefill_left > 0) for x in order]
        return tuple(min(d, (x + len(r.requests[x].delivered)) % 3) for x, d in zip(
            order, due, strict=True))

    for r, prompt in PROMPTS.items():
        runner.arrive(r, prompt)
    _drive(runner, [(0, 1, 2)] * 20, drafts)
    _check_reference(runner)
    assert runner.stats["fewer_drafts"] > 0 and runner.stats["none_beside_all"] > 0
    runner.close()


def test_a_state_row_is_reused_only_after_its_owner_closed_and_its_steps_retired(
        tt: TtBackend) -> None:
    runner = _runner(tt, depth=2, state_rows=1)
    runner.arrive(0, PROMPTS[0])
    with pytest.raises(PhaseError, match="every state row"):
        runner.arrive(1, PROMPTS[1])
    q = runner.schedule((0,))
    runner.combine(q)
    runner.launch(q)
    runner.abort(0)
    with pytest.raises(PhaseError, match="still scatters into it"):
        runner.release_row(0)
    retire_oldest(runner)
    runner.release_row(0)
    runner.arrive(1, PROMPTS[1])
    assert runner.requests[1].state_row == 0
    _drive(runner, [(1,)] * 12)
    assert runner.requests[1].delivered == ProbeReference(ProbeSpec()).sequence(
        PROMPTS[1], MAX_TOKENS)
    events = runner.events.events
    divergence = validate(events, bounds_of(events))
    assert divergence is None, divergence.line()
    runner.close()


def test_the_ring_refuses_subsets_at_depth_three() -> None:
    with pytest.raises(ValueError, match="use state='rows'"):
        RunnerConfig(depth=3, slots=3, subsets=True)

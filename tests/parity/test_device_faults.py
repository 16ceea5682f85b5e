"""Device faults mid-pipeline lose nothing (spec rule 12), one test per fault kind.

Each run serves the battery's workload at depth 2 on the emulated device with hazards raised,
and a fault armed once the pipeline is full (`impl/device/injection.py`). The promise, checked
on the data: every request's tokens are a prefix of the sync run's, and equal to them unless it
failed; the failed requests carry the device's error; no hazard; the device buffers are back to
what load left; the run's events validate against the model, fault included; and the fault
really hit a full pipeline (the other in-flight step went on delivering to a request it spared).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import cache

import pytest
import ttnn

from ttmirror.conformance.validate import bounds_of, validate
from ttmirror.impl.device import Emulator, SeededScheduler, open_device
from ttmirror.impl.events import Event
from ttmirror.impl.runner import DeviceFault, Status
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.models import load_model
from ttmirror.serving.workload import Outcome, run_workload, standard_plan

ROWS, KV_TOKENS, SEED = 6, 24, 23
ARM_AT = 7
"""The engine iteration after which the fault is armed: both steps are in flight, and the step
the fault hits has a bystander (each test requires one; iterations 7 and 11 have one for
every kind)."""
TIMEOUT_S, STALL_S = 0.5, 0.75
"""The stalled copy lands after the host gave up on it, and before the next wait (queued behind
it) would give up too."""


@dataclass(frozen=True)
class Kind:
    call: str
    op: str | None = None
    stall: bool = False
    trace: bool = False
    phase: str = ""
    """The runner phase the fault must land in."""


KINDS = {
    "stage-write": Kind("write", phase="stage"),
    "combine-op": Kind("op", op="add", phase="combine"),
    "launch-op": Kind("op", op="argmax", phase="launch"),
    "execute-trace": Kind("execute_trace", trace=True, phase="launch"),
    "launch-event": Kind("event", phase="launch"),
    "readback-copy": Kind("read", phase="readback_issue"),
    "readback-timeout": Kind("read", stall=True, phase="readback_complete"),
}


def _device() -> ttnn.MeshDevice:
    return open_device(num_command_queues=2, trace_region_size=1 << 20, emulated=True,
                       emulator=Emulator(scheduler=lambda: SeededScheduler(SEED)))


def _engine(device: ttnn.MeshDevice, *, depth2: bool = True, trace: bool = False,
            timeout: float | None = None) -> ServingEngine:
    return ServingEngine(
        ServingBackend(TtBackend(device), load_model("probe")),
        ServingConfig(async_scheduling="auto" if depth2 else "off", rows=ROWS,
                      kv_tokens=KV_TOKENS, trace=trace, readback_timeout_s=timeout),
    )


@cache
def _sync_tokens() -> dict[int, list[int]]:
    device = _device()
    try:
        engine = _engine(device, depth2=False)
        out = run_workload(engine, standard_plan(load_model("probe").vocab))
        engine.close()
    finally:
        ttnn.close_mesh_device(device)
    return out.tokens


def _faulted_run(arm: object, **options: object) -> tuple[Outcome, ServingEngine, int, int, int]:
    """Serve the workload at depth 2, calling `arm(device)` after iteration ARM_AT. Returns the
    outcome, the engine, the buffers live after load and at the end, and the hazards."""
    device = _device()
    try:
        engine = _engine(device, **options)  # type: ignore[arg-type]
        baseline = len(device.allocator.live)
        iteration = [0]

        def on_step(_: ServingEngine) -> None:
            iteration[0] += 1
            if iteration[0] == ARM_AT:
                arm(device)  # type: ignore[operator]

        out = run_workload(engine, standard_plan(load_model("probe").vocab), on_step=on_step)
        gc.collect()
        live = len(device.allocator.live)
        engine.close()
        return out, engine, baseline, live, device.hazards.total
    finally:
        ttnn.close_mesh_device(device)


def _spared_and_delivered_after(events: list[Event]) -> set[int]:
    """Requests that had a row in flight beside a step when it failed, were not failed by it,
    and then got a token: the fault spared them mid-pipeline."""
    in_flight: list[set[int]] = []  # the requests of each in-flight step, oldest first
    spared: set[int] = set()
    went_on: set[int] = set()
    for event in events:
        if event.action == "schedule":
            in_flight.append(set(event.args))
        elif event.action == "apply":
            in_flight.pop(0)
            went_on |= {r for r, _ in event.get("delivered", ())} & spared
        elif event.action == "fault":
            in_flight.pop(event.args[0])
            spared |= set().union(*in_flight) - set(event.get("failed", ()))
    return went_on


def _check_promise(out: Outcome, engine: ServingEngine, baseline: int, live: int,
                   hazards: int, phase: str) -> None:
    sync = _sync_tokens()
    failed = [r for r, s in out.statuses.items() if s == Status.FAILED]
    assert failed, "the fault failed no request: it never hit a step"
    for r, tokens in out.tokens.items():
        assert tokens == sync[r][: len(tokens)], f"request {r}: not a prefix of the sync run's"
        if r not in failed:
            assert tokens == sync[r], f"request {r} was not failed but its tokens differ"
    for r in failed:
        why = out.errors[r]
        assert why.startswith(phase) and ("injected" in why or "did not fire within" in why), why
    assert set(out.errors) == set(failed)
    assert hazards == 0
    assert live == baseline, f"{live - baseline} device buffers leaked"
    events = engine.runner.events.events
    assert any(e.action == "fault" for e in events)
    divergence = validate(events, bounds_of(events))
    assert divergence is None, divergence.line()
    assert _spared_and_delivered_after(events), "no request in flight beside the fault went on"


@pytest.mark.parametrize("name", KINDS)
def test_a_fault_loses_nothing(name: str) -> None:
    kind = KINDS[name]

    def arm(device: ttnn.MeshDevice) -> None:
        device.faults.arm(kind.call, op=kind.op, stall_s=STALL_S if kind.stall else None)

    out, engine, baseline, live, hazards = _faulted_run(
        arm, trace=kind.trace, timeout=TIMEOUT_S if kind.stall else None)
    assert out.stats["engine_faults"] == 1
    assert out.stats[f"engine_faults_at_{kind.phase}"] == 1
    _check_promise(out, engine, baseline, live, hazards, kind.phase)


def test_a_device_closed_under_the_engine_fails_the_open_requests_and_keeps_their_tokens() -> None:
    out, engine, baseline, live, hazards = _faulted_run(lambda d: d.faults.lose())
    sync = _sync_tokens()
    failed = {r for r, s in out.statuses.items() if s == Status.FAILED}
    finished = {r for r, s in out.statuses.items() if s != Status.FAILED}
    assert failed and all("closed" in out.errors[r] for r in failed)
    for r, tokens in out.tokens.items():
        assert tokens == sync[r][: len(tokens)]
    # Requests that closed before the device went keep all they had; nothing is lost after.
    assert all(out.tokens[r] == sync[r] for r in finished if out.statuses[r] == Status.FINISHED)
    assert hazards == 0 and live == baseline
    events = engine.runner.events.events
    assert validate(events, bounds_of(events)) is None


def test_an_allocation_failure_at_load_is_one_clear_error_and_frees_what_it_took() -> None:
    device = _device()
    try:
        baseline = len(device.allocator.live)
        device.faults.arm("allocate", skip=3)  # some of load's tensors exist by then
        with pytest.raises(DeviceFault, match=r"^allocate: TT_THROW") as caught:
            _engine(device)
        assert caught.value.__cause__ is None and caught.value.__context__ is None
        del caught
        gc.collect()
        assert len(device.allocator.live) == baseline
        # The device is still usable: a second load succeeds and serves.
        engine = _engine(device)
        out = run_workload(engine, standard_plan(load_model("probe").vocab))
        engine.close()
        assert out.tokens == _sync_tokens()
    finally:
        ttnn.close_mesh_device(device)


def test_a_refused_phase_changes_nothing_in_the_runner() -> None:
    """Atomic submission: a phase whose device call fails leaves the runner exactly as it was
    (its view, counters and events), so the engine alone decides what the fault costs."""
    device = _device()
    try:
        engine = _engine(device)
        r = engine.runner
        engine.submit(0, (1, 2, 3), max_tokens=4)
        engine.submit(1, (4, 5), max_tokens=4)
        engine.step()
        engine.step()  # a step in flight, another applied: the slots are in use
        q = r.schedule(r.eligible())
        for phase, call in (("combine", lambda: r.combine(q)), ("launch", lambda: r.launch(q)),
                            ("readback_issue", lambda: r.readback_issue(q))):
            before = (r.abstract(), dict(r.stats), len(r.events))
            device.faults.arm({"combine": "op", "launch": "op", "readback_issue": "read"}[phase])
            with pytest.raises(DeviceFault, match=f"^{phase}"):
                call()
            assert (r.abstract(), dict(r.stats), len(r.events)) == before
            call()  # the same call, with the device well, goes through
        r.fail_step(q, "given up")
        engine.close()
    finally:
        ttnn.close_mesh_device(device)

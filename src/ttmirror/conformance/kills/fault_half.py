"""The fault half of the kill matrix: serving runs that meet one device fault, checked on data.

Each scenario serves the battery's workload at depth 2 on the emulated device (hazards raised)
and arms one fault once the pipeline is full (`emulator/injection.py`): a refused context
write, combine op, forward op, trace replay, launch event or readback copy, a readback that
lands after the host's deadline, or the device closed under the engine. The promise of spec
rule 12, checked on what the run delivered:

- every request's tokens are a prefix of the sync (depth 1, fault-free) run's, and equal to
  them unless the request failed; every failed request carries the device's error;
- no hazard; the device buffers live once the run is idle are exactly those after load;
- the run's events validate against the model, the fault included;
- the fault really hit a full pipeline: the other in-flight step went on delivering to a
  request the fault spared.

Each scenario runs twice: with no logprobs, and with the serving half's logprob workload (the
logprob ring copied beside the ids, and every delivered token's logprobs checked against the
model's own log-softmax), so the ring's events and fences meet every fault too.

`check()` runs every scenario; `kill(bug)` does so with a planted bug of
`bugs.FAULT_HANDLING_BUGS`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from ttmirror.conformance.kills.serving_half import LOGPROBS, logprob_errors, logprob_plan
from ttmirror.conformance.lockstep.planted import overrides
from ttmirror.conformance.rig import open_rig, serving_engine
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import HazardError, ProcessScheduler, SeededScheduler
from ttmirror.impl.devices import ttnn_for
from ttmirror.impl.events import Event
from ttmirror.impl.runner import Status
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import load_model
from ttmirror.serving.workload import Outcome, RequestPlan, run_workload, standard_plan

ROWS, KV_TOKENS, SEED = 6, 24, 23
ARM_AT = 7
"""The engine iteration after which the fault is armed: both steps are in flight, and the step
the fault hits has a bystander (the promise requires one; iterations 7 and 11 have one for every
kind)."""
TIMEOUT_S, STALL_S = 0.5, 0.75
"""The stalled copy lands after the host gave up on it, and before the next wait (queued behind
it) would give up too."""


@dataclass(frozen=True)
class Kind:
    call: str
    """The device call that fails (`injection.CALLS`), "lost" for the device closed, or
    "killed" for the emulated device's process killed (`ProcessScheduler`)."""
    op: str | None = None
    seeded_op: str | None = None
    """The op that fails when the engine samples with a seed (the logprob workload), if not
    `op`: the sampler there is `ttnn.sampling`, not `ttnn.argmax`."""
    stall: bool = False
    trace: bool = False
    phase: str = ""
    """The runner phase the fault lands in (what the failed requests' errors start with)."""
    says: tuple[str, ...] = ("injected", "did not fire within")
    """What a failed request's error holds (one of them): the device's own words."""


KINDS = {
    "stage-write": Kind("write", phase="stage"),
    "combine-op": Kind("op", op="add", phase="combine"),
    "launch-op": Kind("op", op="argmax", seeded_op="sampling", phase="launch"),
    "execute-trace": Kind("execute_trace", trace=True, phase="launch"),
    "launch-event": Kind("event", phase="launch"),
    "readback-copy": Kind("read", phase="readback_issue"),
    "readback-timeout": Kind("read", stall=True, phase="readback_complete"),
    "device-closed": Kind("lost"),
    "device-process-killed": Kind("killed", says=("process ended",)),
}
LOGPROB_RUNS = (False, True)
"""Each scenario without logprobs, then with the logprob workload."""


@dataclass
class FaultRun:
    """What one faulted run left: its outcome and events, buffers and hazards."""

    kind: str
    logprobs: bool
    """Served the logprob workload (`serving.logprob_plan`)."""
    out: Outcome
    events: list[Event]
    baseline: int
    """Device buffers live right after load."""
    live: int
    """Device buffers live once the run was idle."""
    hazards: int
    faults: int
    """Faults the engine met."""


def open_emulated(process: bool = False) -> Any:
    """The emulated device; with `process`, its queues run in a device process of their own."""
    scheduler = ProcessScheduler if process else (lambda: SeededScheduler(SEED))
    return open_rig("default", scheduler=scheduler)


def engine_on(device: Any, *, depth2: bool = True, trace: bool = False,
              timeout: float | None = None, bug: str | None = None,
              logprobs: bool = False, spec_tokens: int = 0) -> ServingEngine:
    return serving_engine(
        device, load_model("probe"),
        ServingConfig(async_scheduling="auto" if depth2 else "off", rows=ROWS,
                      kv_tokens=KV_TOKENS, trace=trace, readback_timeout_s=timeout,
                      max_logprobs=LOGPROBS if logprobs else 0, overrides=overrides([bug]),
                      spec_tokens=spec_tokens),
        SamplingParams(seed=SEED) if logprobs else None,
    )


def plan(logprobs: bool = False) -> list[RequestPlan]:
    vocab = load_model("probe").vocab
    return logprob_plan(vocab) if logprobs else standard_plan(vocab)


@cache
def sync_tokens(logprobs: bool = False) -> dict[int, list[int]]:
    """What each request of the workload is owed: a depth-1, fault-free run."""
    device = open_emulated()
    try:
        engine = engine_on(device, depth2=False, logprobs=logprobs)
        out = run_workload(engine, plan(logprobs))
        engine.close()
    finally:
        ttnn_for(device).close_mesh_device(device)
    return out.tokens


def faulted_run(name: str, arm_at: int = ARM_AT, bug: str | None = None,
                logprobs: bool = False, spec_tokens: int = 0) -> FaultRun:
    """Serve the workload (the logprob one with `logprobs`) at depth 2, `bug` planted, with the
    fault `name` armed after iteration `arm_at` (with `spec_tokens` drafts per decoding row)."""
    kind = KINDS[name]
    device = open_emulated(process=kind.call == "killed")
    try:
        engine = engine_on(device, trace=kind.trace, timeout=TIMEOUT_S if kind.stall else None,
                           bug=bug, logprobs=logprobs, spec_tokens=spec_tokens)
        baseline = len(device.allocator.live)

        iterations = [0]

        def arm(_: ServingEngine) -> None:
            iterations[0] += 1
            if iterations[0] != arm_at:
                return
            if kind.call == "lost":
                device.faults.lose()
            elif kind.call == "killed":
                device.scheduler.kill()
            else:
                op = kind.seeded_op if logprobs and kind.seeded_op else kind.op
                device.faults.arm(kind.call, op=op, stall_s=STALL_S if kind.stall else None)

        out = run_workload(engine, plan(logprobs), on_step=arm)
        gc.collect()
        live = len(device.allocator.live)
        events = list(engine.runner.events.events)
        met = engine.stats["faults"]
        engine.close()
        return FaultRun(name, logprobs, out, events, baseline, live, device.hazards.total, met)
    finally:
        ttnn_for(device).close_mesh_device(device)


def spared_and_delivered_after(events: list[Event]) -> set[int]:
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


def promise_errors(run: FaultRun) -> list[str]:
    """What of rule 12's promise `run` broke (empty: nothing)."""
    kind, out, errors = KINDS[run.kind], run.out, []
    owed = sync_tokens(run.logprobs)
    failed = {r for r, s in out.statuses.items() if s == Status.FAILED}
    if not failed:
        errors.append("the fault failed no request: it never hit a step")
    for r, tokens in out.tokens.items():
        if tokens != owed[r][: len(tokens)]:
            errors.append(f"request {r} got {tokens}, not a prefix of the sync run's {owed[r]}")
        elif r not in failed and tokens != owed[r]:
            errors.append(f"request {r} was not failed but got {tokens}, not {owed[r]}")
    for r in failed:
        why = out.errors.get(r, "")
        if not why.startswith(kind.phase) or not any(words in why for words in kind.says):
            errors.append(f"request {r} failed without the device's error: {why!r}")
    if set(out.errors) != failed:
        errors.append(f"errors for {sorted(out.errors)}, failed {sorted(failed)}")
    if run.hazards:
        errors.append(f"{run.hazards} hazards")
    if run.live != run.baseline:
        errors.append(f"{run.live - run.baseline} device buffers leaked")
    if not any(e.action == "fault" for e in run.events):
        errors.append("no fault event was recorded")
    d = validate(run.events, bounds_of(run.events))
    if d is not None:
        errors.append(d.line())
    if kind.call not in ("lost", "killed") and not spared_and_delivered_after(run.events):
        errors.append("no request in flight beside the fault went on")
    if run.logprobs:  # every delivered token's logprobs are the model's, failed requests' too
        errors += logprob_errors(out, plan(True), load_model("probe"))
    elif out.logprobs:
        errors.append(f"logprobs delivered to {sorted(out.logprobs)}, none asked")
    return errors


@dataclass
class Verdict:
    """Every scenario run: which check failed first (None: every check held)."""

    layer: str | None
    message: str | None
    seconds: float


def check(kinds: list[str] | None = None,
          on_run: Callable[[FaultRun], None] | None = None, bug: str | None = None) -> Verdict:
    """Run the scenarios (default: all), `bug` planted, and check the promise; stop at the first
    failure."""
    started = time.perf_counter()

    def verdict(layer: str | None, message: str | None) -> Verdict:
        return Verdict(layer, message, round(time.perf_counter() - started, 3))

    for logprobs in LOGPROB_RUNS:
        for name in kinds or list(KINDS):
            where = f"{name}{' with logprobs' if logprobs else ''}"
            try:
                run = faulted_run(name, bug=bug, logprobs=logprobs)
            except HazardError as e:
                return verdict("hazard", f"{where}: {str(e).splitlines()[0]}"[:300])
            except Exception as e:  # the implementation raised: a kill, as in the lockstep
                return verdict("crash", f"{where}: {type(e).__name__}: {e}"[:300])
            if on_run is not None:
                on_run(run)
            errors = promise_errors(run)
            if errors:
                layer = "model" if any("left the model" in e for e in errors) else "device data"
                return verdict(layer, f"{where}: {errors[0]}"[:300])
    return verdict(None, None)


def kill(bug: str) -> tuple[bool, Verdict]:
    """Run the scenarios with `bug` planted: (killed, what found it)."""
    v = check(bug=bug)
    return v.layer is not None, v

"""The soak: the serving loop for a long run, with device faults, checked on data.

The `ServingEngine` serves at depth 2 on the emulated TT device, hazards counted rather than
raised. By default the device completes its commands on a simulated clock (`TimedScheduler`,
seeded by the soak's seed: per-command times with jitter decide which queue finishes first, and
a late read is held until the host gave up waiting for it), so a seed replays the whole run,
the device's completion order included (`SoakReport.device_order`). `clock="threaded"` runs
each command queue on a worker thread instead (`ThreadedScheduler`): real concurrency, which
the seed does not replay. Requests arrive at
random (prompts, budgets, stop sets, per-request sampling, some host-sync), some are aborted
after a random number of tokens, the KV budget preempts, and before about `fault_rate` of the
steps one device fault is armed (`emulator/injection.py`): a refused write, op, event or read,
a refused trace replay when traced, or a read that lands after the host's readback deadline.

Every random choice comes from one seed. The checks, all on data:

- hazards: 0 (the emulated device's detector, on every command);
- tokens lost or duplicated: 0, counted against a sync (depth 1, fault-free) replay of the same
  requests: a request's tokens must equal the replay's, or, for a request a fault failed, be a
  prefix of them;
- logprobs wrong: 0: with the logprob ring on (`SoakConfig.logprobs`, the default; about half
  the requests ask for logprobs), every delivered token's ring entry equals the replay's;
- device buffers live once the run is idle: exactly as many as right after load;
- the run's events, streamed to an ITF trace as they are recorded, validate against the model
  (`validate.py`), faults included.

`SoakReport.ok()` is all of them; a failure names the seed and the trace file that holds the
run (`ttmirror validate FILE` shows a divergence).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from ttmirror.conformance.rig import open_rig, serving_engine
from ttmirror.conformance.soak.config import SoakConfig
from ttmirror.conformance.traces.itf import read_events, write_events
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import (
    ManualScheduler,
    ProcessScheduler,
    ThreadedScheduler,
    TimedScheduler,
)
from ttmirror.impl.backend import TokenLogprobs
from ttmirror.impl.devices import ttnn_for
from ttmirror.impl.events import Event
from ttmirror.impl.runner import CLOSED, Status
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.engine import Watchdog
from ttmirror.serving.models import DecoderModel, load_model
from ttmirror.serving.workload import RequestPlan, due_for_abort, run_workload

COMMON_FAULTS: tuple[tuple[str, bool], ...] = (
    ("write", False), ("event", False), ("read", False), ("read", True),
)
"""What the soak arms: (the device call that fails, whether it is a late read instead)."""
EAGER_FAULTS = (*COMMON_FAULTS, ("op", False))
TRACED_FAULTS = (*COMMON_FAULTS, ("execute_trace", False))
"""A traced step enqueues no op of its own (the replay does): a refused replay instead."""
SAMPLINGS: tuple[SamplingParams | None, ...] = (
    None, SamplingParams(), SamplingParams(seed=7, top_k=4, temperature=0.7),
)
"""A request's own sampling: the engine's (seeded), greedy, or its own seeded setting."""
ARRIVAL_CHANCE = 0.7
"""Chance that a request arrives before an engine iteration (while the queue is short)."""
PATIENCE = 3.0
"""A late read the host gave up on lands at the host's next call, or, where the host makes none
before waiting on the next readback (queued behind it), this many deadlines after the wait
began: the next wait then does not give up (the threaded clock's read lands 1.5 deadlines after
issue). The host makes its next call microseconds after giving up, far inside that."""
DEVICE_S = 1.0
"""The simulated clock's time per device command (jittered by half), against the host's 1.0
per call: the queues sometimes lag the host and sometimes keep up, so which queue completes
first varies from step to step."""


@dataclass
class SoakReport:
    steps: int = 0
    iterations: int = 0
    requests: int = 0
    tokens: int = 0
    faults: int = 0
    """Faults the engine met (each failed one step)."""
    injected: int = 0
    """Faults the device fired (an armed fault that never met its call does not fire)."""
    injected_by_call: dict[str, int] = field(default_factory=dict)
    """The same by device call ("stall": a read accepted to land late). A stall fires without
    being met when the copy lands within the deadline after all: the deadline counts from the
    host's wait, which may begin well after the copy was issued."""
    faults_by_phase: dict[str, int] = field(default_factory=dict)
    failed_requests: int = 0
    preemptions: int = 0
    aborts: int = 0
    hazards: int = 0
    lost_tokens: int = 0
    duplicated_tokens: int = 0
    """Tokens delivered that the sync replay did not deliver there (extra, repeated or wrong)."""
    logprob_tokens: int = 0
    """Delivered tokens that came with the logprob ring's entry (0: the ring is off)."""
    wrong_logprobs: int = 0
    """Of those, entries other than the replay's for the same token (or missing)."""
    leaked_buffers: int = 0
    baseline_buffers: int = 0
    events: int = 0
    validated: bool = False
    divergence: str | None = None
    delivered: str = ""
    """SHA-256 of every request's delivered tokens, request by request: what a replay of the seed
    must deliver again."""
    device_order: str = ""
    """SHA-256 of the labels of every device command in the order they completed: equal for two
    runs of one seed on the simulated clock (the interleavings replay), not on threads."""
    clock: str = "simulated"
    device: str = "host"
    """Where the device's queues ran: the host's process or a device process of their own."""
    peak_rss_mb: float = 0.0
    seconds: float = 0.0
    seed: int = 0
    trace_file: str = ""

    def ok(self) -> bool:
        return (self.hazards == 0 and self.lost_tokens == 0 and self.duplicated_tokens == 0
                and self.wrong_logprobs == 0 and self.leaked_buffers == 0 and self.validated)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _request(rng: random.Random, req: int, it: int, model: DecoderModel,
             cfg: SoakConfig) -> RequestPlan:
    """A random request that the engine can serve (it fits the context and the KV budget)."""
    kv_tokens = cfg.kv_tokens
    prompt_len = rng.randint(1, 6)
    room = min(model.max_context - 1, kv_tokens) - (prompt_len - 1)
    max_tokens = rng.randint(1, max(1, min(12, room)))
    stops = (frozenset(rng.sample(range(model.vocab), max(1, model.vocab // 8)))
             if rng.random() < 0.3 else frozenset())
    abort_after = rng.randint(1, max_tokens) if rng.random() < 0.15 else None
    sampling = rng.choice(SAMPLINGS)
    if cfg.logprobs and rng.random() < 0.5:  # drawn only with the ring: seeds stay as they were
        sampling = dataclasses.replace(sampling or _engine_sampling(cfg),
                                       logprobs=rng.randint(0, cfg.logprobs))
    return RequestPlan(
        req=req, arrival=it,
        prompt=tuple(rng.randrange(model.vocab) for _ in range(prompt_len)),
        max_tokens=max_tokens, stop_ids=stops, abort_after=abort_after,
        host_sync=rng.random() < 0.1, sampling=sampling,
    )


def _engine_sampling(cfg: SoakConfig) -> SamplingParams:
    """The engine's own sampling: what a request without its own samples with."""
    return SamplingParams(seed=cfg.seed + 1)


def _open(model: DecoderModel, scheduler: Callable[[], Any], hazard_mode: str,
          process: bool = False) -> Any:
    return open_rig("serving", scheduler=scheduler, model=model, model_rows=32,
                    hazard_mode=hazard_mode, process=process)  # type: ignore[arg-type]


def _engine(device: Any, model: DecoderModel, cfg: SoakConfig, depth2: bool) -> ServingEngine:
    return serving_engine(
        device, model,
        ServingConfig(async_scheduling="auto" if depth2 else "off", rows=cfg.rows,
                      kv_tokens=cfg.kv_tokens, trace=cfg.trace and depth2,
                      max_logprobs=cfg.logprobs,
                      readback_timeout_s=cfg.readback_timeout_s if depth2 else None),
        _engine_sampling(cfg),
    )


class _Run:
    """The faulted depth-2 run, driven as a generator of its events (so they stream to disk)."""

    def __init__(self, cfg: SoakConfig, model: DecoderModel, report: SoakReport,
                 progress: Callable[[int], None] | None) -> None:
        self.cfg, self.model, self.report, self.progress = cfg, model, report, progress
        self.rng = random.Random(cfg.seed)
        self.plan: list[RequestPlan] = []
        self.tokens: dict[int, list[int]] = {}
        self.logprobs: dict[int, list[TokenLogprobs]] = {}
        self.statuses: dict[int, Status] = {}

    def events(self) -> Iterator[Event]:
        cfg, report, rng = self.cfg, self.report, self.rng
        process = cfg.device == "process"
        threads = ProcessScheduler if process else ThreadedScheduler
        scheduler: Callable[[], Any] = threads if cfg.clock == "threaded" else (
            lambda: TimedScheduler(seed=cfg.seed, default_s=DEVICE_S,
                                   patience_s=PATIENCE * cfg.readback_timeout_s))
        device = _open(self.model, scheduler, "count",
                       process=process and cfg.clock != "threaded")
        order = hashlib.sha256()
        device.observers.append(lambda command: order.update(command.label.encode() + b";"))
        try:
            engine = _engine(device, self.model, cfg, depth2=True)
            report.baseline_buffers = len(device.allocator.live)
            log = engine.runner.events
            faults = TRACED_FAULTS if cfg.trace else EAGER_FAULTS
            by_req: dict[int, RequestPlan] = {}
            aborted: set[int] = set()
            it = 0
            watchdog = Watchdog(engine)
            while True:
                arriving = engine.runner.steps < cfg.steps
                if arriving and len(engine.queued) < 2 * cfg.rows and (
                        rng.random() < ARRIVAL_CHANCE):
                    p = _request(rng, len(self.plan), it, self.model, cfg)
                    self.plan.append(p)
                    by_req[p.req] = p
                    engine.submit(p.req, p.prompt, max_tokens=p.max_tokens, stop_ids=p.stop_ids,
                                  host_sync=p.host_sync, sampling=p.sampling)
                if arriving and not device.faults.armed and rng.random() < cfg.fault_rate:
                    call, late = rng.choice(faults)
                    device.faults.arm(call, stall_s=(cfg.readback_timeout_s * cfg.stall_factor
                                                     if late else None))
                engine.step()
                for req in due_for_abort(engine, by_req, aborted):
                    engine.abort(req)
                    aborted.add(req)
                it += 1
                yield from log.events
                log.events.clear()
                if self.progress is not None and it % 1000 == 0:
                    self.progress(engine.runner.steps)
                if not arriving and engine.idle():
                    break
                watchdog.check()
                if it > 4 * cfg.steps + 10_000:
                    raise RuntimeError(f"the soak did not drain within {it} iterations")
            device.faults.disarm()
            gc.collect()
            report.leaked_buffers = len(device.allocator.live) - report.baseline_buffers
            report.iterations, report.steps = it, engine.runner.steps
            report.hazards = device.hazards.total
            report.injected = sum(device.faults.injected.values())
            report.injected_by_call = dict(sorted(device.faults.injected.items()))
            report.faults = engine.stats["faults"]
            report.faults_by_phase = {k.removeprefix("faults_at_"): v
                                      for k, v in sorted(engine.stats.items())
                                      if k.startswith("faults_at_")}
            report.preemptions = engine.kv.preemptions
            report.aborts = len(aborted)
            report.device_order = order.hexdigest()
            for req, r in engine.runner.requests.items():
                self.tokens[req], self.statuses[req] = list(r.delivered), r.status
                self.logprobs[req] = list(r.logprobs)
            engine.close()
        finally:
            ttnn_for(device).close_mesh_device(device)


def _sync_replay(cfg: SoakConfig, model: DecoderModel, plan: list[RequestPlan],
                 say: Callable[[str], None]) -> tuple[
        dict[int, list[int]], dict[int, list[TokenLogprobs]]]:
    """The same requests at depth 1, fault-free: what each was owed, tokens and ring entries."""
    device = _open(model, ManualScheduler, "raise")
    began = time.monotonic()

    said = [0]

    def note(engine: ServingEngine) -> None:  # a long replay says how far it is
        steps = engine.runner.steps
        if steps >= said[0] + 10_000:
            said[0] = steps
            done = sum(1 for r in engine.runner.requests.values() if r.status in CLOSED)
            say(f"soak: replay at step {steps:,}, {done:,} of {len(plan):,} requests done "
                f"({time.monotonic() - began:,.0f} s)")

    try:
        engine = _engine(device, model, cfg, depth2=False)
        engine.runner.events.enabled = False
        out = run_workload(engine, plan, on_step=note, max_iterations=50 * len(plan) + 10_000)
        logprobs = {req: list(r.logprobs) for req, r in engine.runner.requests.items()}
        engine.close()
    finally:
        ttnn_for(device).close_mesh_device(device)
    return out.tokens, logprobs


def _count(run: _Run, owed: dict[int, list[int]],
           owed_logprobs: dict[int, list[TokenLogprobs]], report: SoakReport) -> None:
    """Lost and duplicated tokens and wrong logprobs, request by request, against the replay."""
    statuses = run.statuses
    for req, got in run.tokens.items():
        want = owed[req]
        common = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                      min(len(got), len(want)))
        if run.cfg.logprobs:  # one ring entry per delivered token, the replay's for its token
            entries, wanted = run.logprobs[req], owed_logprobs[req]
            report.logprob_tokens += len(entries)
            report.wrong_logprobs += abs(len(got) - len(entries)) + sum(
                a != b for a, b in zip(entries[:common], wanted[:common], strict=False))
        report.duplicated_tokens += len(got) - common
        if statuses[req] != Status.FAILED:  # a failed request is owed nothing past its failure
            report.lost_tokens += len(want) - common
        report.tokens += len(got)
    report.failed_requests = sum(s == Status.FAILED for s in statuses.values())


def run_soak(cfg: SoakConfig, trace_file: Path,
             progress: Callable[[str], None] | None = None) -> SoakReport:
    """Run the soak, stream its events to `trace_file`, replay it sync, validate the trace."""
    start = time.perf_counter()
    model = load_model(cfg.model)
    report = SoakReport(seed=cfg.seed, trace_file=str(trace_file), clock=cfg.clock,
                        device=cfg.device)
    say = progress or (lambda _: None)
    last = [time.perf_counter(), 0]

    def stepped(n: int) -> None:  # the rate since the last line: a slowdown shows as it happens
        now = time.perf_counter()
        rate = (n - last[1]) / max(now - last[0], 1e-9)
        last[:] = [now, n]
        say(f"soak: {n:,} of {cfg.steps:,} steps ({rate:,.0f} steps/s)")

    run = _Run(cfg, model, report, stepped)
    report.events = write_events(run.events(), trace_file)
    say(f"soak: replaying {len(run.plan):,} requests at depth 1")
    owed, owed_logprobs = _sync_replay(cfg, model, run.plan, say)
    _count(run, owed, owed_logprobs, report)
    report.delivered = hashlib.sha256(repr(sorted(run.tokens.items())).encode()).hexdigest()
    report.requests = len(run.plan)
    say(f"soak: validating {report.events:,} events")
    events = read_events(trace_file)
    first = next(events)
    divergence = validate(chain([first], events), bounds_of(first))
    report.validated = divergence is None
    report.divergence = None if divergence is None else divergence.line()
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report.peak_rss_mb = round(usage / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def summary(report: SoakReport) -> list[str]:
    """The report as lines a person reads."""
    phases = ", ".join(f"{k} {v}" for k, v in report.faults_by_phase.items()) or "none"
    verdict = "PASS" if report.ok() else "FAIL"
    return [
        f"steps {report.steps:,} in {report.iterations:,} iterations; {report.requests:,} "
        f"requests, {report.tokens:,} tokens; {report.preemptions:,} preemptions, "
        f"{report.aborts:,} aborts",
        f"faults: {report.injected:,} injected ("
        + ", ".join(f"{k} {v}" for k, v in report.injected_by_call.items())
        + f"), {report.faults:,} met by the engine ({phases}); "
        f"{report.failed_requests:,} requests failed with the device's error",
        f"hazards {report.hazards}; tokens lost {report.lost_tokens}, duplicated "
        f"{report.duplicated_tokens}, logprobs wrong {report.wrong_logprobs} of "
        f"{report.logprob_tokens:,} (against a sync replay); device buffers leaked "
        f"{report.leaked_buffers} (baseline {report.baseline_buffers})",
        f"trace: {report.events:,} events, "
        + ("validated against the model" if report.validated
           else f"LEFT THE MODEL: {report.divergence}"),
        f"device: {report.clock} clock, queues in "
        f"{'a device process' if report.device == 'process' else 'the host process'}, "
        f"completion order {report.device_order[:16]}; "
        f"peak memory {report.peak_rss_mb:,.0f} MB; {report.seconds:,.1f} s",
        f"{verdict} (seed {report.seed}"
        + (f"; trace {report.trace_file})" if report.trace_file else ")"),
    ]


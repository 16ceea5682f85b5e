"""Serving throughput at depth 2 vs depth 1 across device/host time ratios, and overlap under
batch-layout churn vs draining.

All on the emulated TT device with its command queues in a device process of their own
(`--device process`, the default: ProcessScheduler), so device work runs while the host builds
the next step, on another interpreter, as a chip's cores do; the sweep is then repeated with a
worker thread per queue in the host's process (ThreadedScheduler, the emulator before it had a
process), for comparison, and the last line prints both shares of the ideal side by side.
Per step, the device's time d is its
busiest queue's busy time (from taking up a command to completing it: the emulated kernels,
and the decoder op's configured time s), and the host's time h is the depth-1 step less d.
Both are calibrated first with s = 0, in this run; each point then sets s = ratio x h - d0 so
that d/h is the ratio (d0, the kernels alone, is the lowest d there is), and measures h and d
again there (the host's time drifts from run to run; the ideal is computed from the point's
own figures, and the point prints the d/h it measured).

1. The sweep, at each ratio d/h in RATIOS: tokens/s of the same workload at depth 2 (async) and
   depth 1 (sync), interleaved rounds, medians. Depth 1 takes h + d per step and depth 2 ideally
   max(h, d), so the ideal speedup is (h + d) / max(h, d): 2 at d = h, 1.25 at d = h/4 or 4h.
   Each point prints the measured speedup beside the ideal and their quotient, and the queue
   workers' CPU per step, w: on threads the emulated kernels are Python that shares the host's
   GIL (a chip's cores do not), so that much of d cannot overlap the host's work there, whatever
   the engine does; in the device process it takes a core of its own. The same point serves a
   churn workload (a request arrives every 2 steps and short ones finish, so the batch layout
   changes at least every 3 steps; checked): the fraction of launches that overlapped a step
   still in flight, with our design (the mirror combines across layout changes) and with the
   TT plugin's policy (drain every in-flight step when the layout changes).
2. At d = h, depth 2 with every request asking for its top-3 logprobs (the logprob ring beside
   the ids, its program after the sampler, its copy under the ids' event) beside without: what
   the second payload costs, and that depth 2 still overlaps with it.
3. At d = h, the runner's event log (what trace validation reads) on, its default, and off.
4. At d = h, speculative decoding (spec rule 13): K = 1 and 2 drafts per decoding row beside
   none, at depth 2 and at depth 1, interleaved rounds, every request queued at once (so the
   batch stays full however soon requests finish): tokens per step, milliseconds per step,
   tokens/s, and the acceptance rate the device's verification measured (drafts accepted over
   drafts scheduled; the probe's drafter is right on a seeded share of its table). The verify
   and draft ops are emulated kernels in Python too, on the host's GIL: tokens per step is
   what drafts buy on any device, tokens/s what they bought on this one. A step's 1 + K query tokens
   are configured to take the decoder op's time of one token, s, in all (s / (1 + K) per lane):
   a decode step is memory-bound, so verifying a few tokens costs about what decoding one does;
   the drafter's own op costs its emulated kernel's time. The tokens are plain decoding's.

Every run that records its events (all but the recording-off ones of 3) is then validated
against the model, outside its timing; a divergence exits 1. The last lines print the ratios,
and whether every point of the sweep reached 0.9 of its ideal speedup (where not, why, in
figures).
Usage: python benchmarks/bench_engine.py [--rounds R] [--ratios 0.25,0.5,1,2,4]
                                         [--device process|threads] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from pinning import add_pin, split_cores

from ttmirror.conformance.rig import open_rig, serving_engine
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import ProcessScheduler, ThreadedScheduler
from ttmirror.impl.probe import ProbeSpec
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.workload import Outcome, RequestPlan, run_workload

MODEL = ProbeDecoder(ProbeSpec(seed=5))
VALIDATED = {"runs": 0, "events": 0}
"""Every run that records its events is validated against the model (a divergence exits 1)."""
ROWS = 8
LOGPROBS = 3
SPEC_TOKENS = (0, 1, 2)
"""Drafts per decoding row in section 4 (0: none, the baseline)."""
RATIOS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Device time per step over host time per step, d/h, at each point of the sweep."""
TARGET = 0.9
"""Every point's measured speedup must reach this share of its ideal."""
DEVICES = ("process", "threads")
DEVICE = ["process"]
PIN: list[frozenset[int]] = []
"""(the host's cores, the device process's) when `--pin` (the default where there are two
cores or more): each side on cores of its own, as a host and a chip are, so the OS does not
time-slice the device's work with the host's on one core while the other idles."""
"""Where the emulated device's queues run (`--device`): a device process of their own
(`ProcessScheduler`: the kernels on their own interpreter, as a chip's cores) or worker threads
in the host's process (`ThreadedScheduler`: the kernels take turns with the host on its GIL)."""


def steady_plan(requests: int = 16) -> list[RequestPlan]:
    """Requests that keep the batch full: throughput, not scheduling, is measured."""
    return [
        RequestPlan(
            req=i,
            arrival=0 if i < ROWS else 2 * i,
            prompt=((5 * i) % MODEL.vocab, (3 * i + 1) % MODEL.vocab),
            max_tokens=24 + (i % 5),
        )
        for i in range(requests)
    ]


def queued_plan() -> list[RequestPlan]:
    """`steady_plan`'s requests all submitted at once: a request that finishes sooner (with
    drafts) frees its row for the next at once, so every configuration keeps the batch full."""
    return [replace(p, arrival=0) for p in steady_plan()]


def churn_plan(requests: int = 80) -> list[RequestPlan]:
    """A new request every 2 iterations, lengths 3 to 6: arrivals and finishes keep the layout
    moving."""
    return [
        RequestPlan(
            req=i,
            arrival=2 * i,
            prompt=((7 * i) % MODEL.vocab, (11 * i + 3) % MODEL.vocab),
            max_tokens=3 + (i % 4),
        )
        for i in range(requests)
    ]


@dataclass
class Measured:
    outcome: Outcome
    layouts: list[tuple[int, ...]]
    device_cpu_s: float
    """The emulated queue workers' CPU over the run: the device's own work, in Python."""
    busy_s: float
    """The busiest queue's busy time over the run: the device's time."""
    host_cpu_s: float
    """The host's thread's own CPU over the run (what it computed, not what it waited)."""

    @property
    def step_s(self) -> float:
        return self.outcome.seconds / self.outcome.stats["launches"]

    @property
    def device_cpu_per_step(self) -> float:
        return self.device_cpu_s / self.outcome.stats["launches"]

    @property
    def host_cpu_per_step(self) -> float:
        return self.host_cpu_s / self.outcome.stats["launches"]

    @property
    def busy_per_step(self) -> float:
        return self.busy_s / self.outcome.stats["launches"]

    @property
    def tokens_per_s(self) -> float:
        return self.outcome.generated / self.outcome.seconds

    @property
    def overlapped(self) -> float:
        s = self.outcome.stats
        return s.get("overlapped_launches", 0) / max(1, s.get("launches", 0))


def serve(
    plan: list[RequestPlan], mode: str, delay_s: float, drain: bool = False,
    logprobs: int = 0, record: bool = True, spec: int = 0, device_kind: str | None = None,
) -> Measured:
    # With drafts the decoder op runs 1 + K lanes, together the time of one decode step.
    costs = {"decoder_forward": delay_s, "decoder_lane": delay_s / (1 + spec)}
    kind = device_kind or DEVICE[0]
    if kind == "process":
        with pinned():
            return _serve(ProcessScheduler(costs, cpus=PIN[1] if PIN else None), plan, mode,
                          drain, logprobs, record, spec)
    return _serve(ThreadedScheduler(costs), plan, mode, drain, logprobs, record, spec)


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """The host's thread (and the threads it starts) on its own core for the run, as `PIN`
    says; the device process then runs on the others (`ProcessScheduler(cpus=...)`)."""
    if not PIN:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, PIN[0])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _serve(scheduler: ProcessScheduler | ThreadedScheduler, plan: list[RequestPlan], mode: str,
           drain: bool, logprobs: int, record: bool, spec: int) -> Measured:
    device = open_rig("default", scheduler=lambda: scheduler, trace_region=0)
    engine = serving_engine(
        device, MODEL,
        ServingConfig(async_scheduling=mode, rows=ROWS, drain_on_layout_change=drain,
                      max_logprobs=logprobs, record_events=record, spec_tokens=spec))
    if logprobs:
        plan = [replace(p, sampling=SamplingParams(logprobs=logprobs)) for p in plan]
    layouts: list[tuple[int, ...]] = []

    def note_layout(e: ServingEngine) -> None:
        if e.runner.steps > len(layouts):
            layouts.append(e.last_layout)

    began = time.thread_time()
    outcome = run_workload(engine, plan, on_step=note_layout)
    host_cpu_s = time.thread_time() - began
    if engine.runner.events.enabled:  # outside the timed run: validation is not its cost
        events = engine.runner.events.events
        d = validate(events, bounds_of(events))
        if d is not None:
            raise SystemExit(f"bench-engine: a {mode} run {d.line()}")
        VALIDATED["runs"] += 1
        VALIDATED["events"] += len(events)
    engine.close()
    hazards = device.hazards.total
    device.api.close_mesh_device(device)  # joins the queue workers: their CPU is final
    assert hazards == 0, device.hazards.counts
    return Measured(outcome, layouts, sum(scheduler.cpu_s.values()),
                    max(scheduler.busy_s.values(), default=0.0), host_cpu_s)


def longest_same_layout(layouts: list[tuple[int, ...]]) -> int:
    longest = run = 1
    for before, after in itertools.pairwise(layouts):
        run = run + 1 if before == after else 1
        longest = max(longest, run)
    return longest


def calibrate(rounds: int, kind: str | None = None) -> tuple[float, float]:
    """The host's time per step h and the device's d, with no configured device time (a
    depth-1 step is h + d; d is the busiest queue's busy time): medians of `rounds` runs."""
    serve(steady_plan(4), "off", 0.0, device_kind=kind)  # warm: program cache, torch kernels
    bare = [serve(steady_plan(), "off", 0.0, device_kind=kind) for _ in range(rounds)]
    d = statistics.median(m.busy_per_step for m in bare)
    return statistics.median(m.step_s for m in bare) - d, d


def steady(rounds: int, delay: float, kind: str | None = None
           ) -> tuple[list[Measured], list[Measured]]:
    """`rounds` runs at depth 2 and at depth 1, interleaved so drift hits both alike."""
    d2, d1 = [], []
    for _ in range(rounds):
        d2.append(serve(steady_plan(), "auto", delay, device_kind=kind))
        d1.append(serve(steady_plan(), "off", delay, device_kind=kind))
    for a, b in zip(d2, d1, strict=True):
        assert a.outcome.tokens == b.outcome.tokens, "depth 2 and depth 1 tokens differ"
    return d2, d1


@dataclass
class Logprobs:
    """Section 2: depth 2 with every request asking for logprobs (`on`) and without (`off`)."""

    on: list[Measured]
    off: list[Measured]

    def rate(self, on: bool) -> float:
        return statistics.median(m.tokens_per_s for m in (self.on if on else self.off))

    def device_ms(self, on: bool) -> float:
        """The device's time per step (its busiest queue's), milliseconds."""
        return 1e3 * statistics.median(m.busy_per_step for m in (self.on if on else self.off))

    def step_ms(self, on: bool) -> float:
        return 1e3 * statistics.median(m.step_s for m in (self.on if on else self.off))

    @property
    def overlapped(self) -> float:
        return min(m.overlapped for m in self.on)

    def why(self) -> str:
        """The ring's cost beside what it is made of, in this run's figures."""
        return (f"the ring costs {1 - self.rate(True) / self.rate(False):.1%} tokens/s: per "
                f"step, its program (top {LOGPROBS} of each row's logits, after the sampler) "
                f"and its copy (under the ids' event) take the device from "
                f"{self.device_ms(False):.2f} to {self.device_ms(True):.2f} ms, and the host "
                f"unpacks {LOGPROBS} logprobs per token delivered; at d = h both sides are "
                f"the step's critical path, which went from {self.step_ms(False):.2f} to "
                f"{self.step_ms(True):.2f} ms")


def with_logprobs(rounds: int, delay: float) -> Logprobs:
    """Depth 2 with every request asking for logprobs and without, interleaved."""
    on, off = [], []
    for _ in range(rounds):
        on.append(serve(steady_plan(), "auto", delay, logprobs=LOGPROBS))
        off.append(serve(steady_plan(), "auto", delay))
    for a, b in zip(on, off, strict=True):
        assert a.outcome.tokens == b.outcome.tokens, "logprobs changed the tokens"
        assert all(len(v) == len(a.outcome.tokens[r]) for r, v in a.outcome.logprobs.items())
    return Logprobs(on, off)


def recording(rounds: int, delay: float) -> tuple[float, float]:
    """Median depth-2 tokens/s with the runner's event log on (the default) and off."""
    on, off = [], []
    for _ in range(rounds):
        on.append(serve(steady_plan(), "auto", delay))
        off.append(serve(steady_plan(), "auto", delay, record=False))
    assert all(a.outcome.tokens == b.outcome.tokens for a, b in zip(on, off, strict=True))
    return (statistics.median(m.tokens_per_s for m in on),
            statistics.median(m.tokens_per_s for m in off))


@dataclass
class Drafted:
    """Section 4 at one K: its depth-2 and depth-1 runs."""

    k: int
    d2: list[Measured]
    d1: list[Measured]

    def rate(self, depth: int) -> float:
        return statistics.median(m.tokens_per_s for m in (self.d2 if depth == 2 else self.d1))

    def per_step(self, depth: int) -> float:
        """Tokens delivered per step (every request's, over the steps launched)."""
        runs = self.d2 if depth == 2 else self.d1
        return statistics.median(m.outcome.generated / m.outcome.stats["launches"] for m in runs)

    def step_ms(self, depth: int) -> float:
        """Milliseconds per step: more ops per step with drafts, fewer steps."""
        return 1e3 * statistics.median(m.step_s for m in (self.d2 if depth == 2 else self.d1))

    @property
    def acceptance(self) -> float:
        """Drafts the device's verification accepted over the drafts scheduled (all runs)."""
        stats = [m.outcome.stats for m in (*self.d2, *self.d1)]
        accepted = sum(n * s.get(f"accepted_{n}", 0) for s in stats for n in range(self.k + 1))
        return accepted / max(1, sum(s.get("drafted_rows", 0) * self.k for s in stats))


def drafted(rounds: int, delay: float) -> list[Drafted]:
    """Each K of `SPEC_TOKENS` at depth 2 and depth 1, rounds interleaved across them all so
    drift hits every configuration alike; every run's tokens are the same."""
    runs: dict[int, Drafted] = {k: Drafted(k, [], []) for k in SPEC_TOKENS}
    for _ in range(rounds):
        for k in SPEC_TOKENS:
            runs[k].d2.append(serve(queued_plan(), "auto", delay, spec=k))
            runs[k].d1.append(serve(queued_plan(), "off", delay, spec=k))
    tokens = [m.outcome.tokens for r in runs.values() for m in (*r.d2, *r.d1)]
    assert all(t == tokens[0] for t in tokens), "drafts changed the tokens"
    assert all(r.k == 0 or r.acceptance > 0 for r in runs.values()), "no draft was accepted"
    return list(runs.values())


def churn(delay: float, kind: str | None = None) -> tuple[Measured, Measured, int]:
    """Our engine and the drain-on-layout-change policy on a workload whose rows keep moving;
    returns both and the longest run of steps with one layout."""
    ours = serve(churn_plan(), "auto", delay, device_kind=kind)
    drain = serve(churn_plan(), "auto", delay, drain=True, device_kind=kind)
    assert ours.outcome.tokens == drain.outcome.tokens, "the drain policy changed the tokens"
    gap = max(longest_same_layout(ours.layouts), longest_same_layout(drain.layouts))
    assert gap <= 3, f"the churn workload kept one layout for {gap} steps"
    return ours, drain, gap


@dataclass
class Point:
    """One ratio of the sweep, from its own runs (medians of the depth-1 runs): the device's
    time d (its busiest queue's busy time per step) and the host's, h = the step less d."""

    ratio: float
    configured_s: float
    """The decoder op's configured time s (part of d)."""
    d2: list[Measured]
    d1: list[Measured]
    ours: Measured
    drain: Measured
    gap: int

    @property
    def rate2(self) -> float:
        return statistics.median(m.tokens_per_s for m in self.d2)

    @property
    def rate1(self) -> float:
        return statistics.median(m.tokens_per_s for m in self.d1)

    @property
    def step1_s(self) -> float:
        """Seconds per step at depth 1: h + d."""
        return statistics.median(m.step_s for m in self.d1)

    @property
    def device_s(self) -> float:
        return statistics.median(m.busy_per_step for m in self.d1)

    @property
    def work_s(self) -> float:
        """w: the queue workers' CPU per step, the part of d that holds the host's GIL."""
        return statistics.median(m.device_cpu_per_step for m in self.d1)

    @property
    def host_cpu(self) -> tuple[float, float]:
        """The host thread's CPU per step at depth 1 and at depth 2: h less this is what the
        host waited at depth 1 beyond the device's time (a wake-up across the boundary, the
        OS), which depth 2 need not pay; where depth 2 beats the ideal, this is why."""
        return (statistics.median(m.host_cpu_per_step for m in self.d1),
                statistics.median(m.host_cpu_per_step for m in self.d2))

    @property
    def host_s(self) -> float:
        return max(self.step1_s - self.device_s, 1e-9)

    @property
    def ideal(self) -> float:
        """(h + d) / max(h, d): depth 2 beside a device that shares nothing with the host."""
        return self.step1_s / max(self.host_s, self.device_s)

    @property
    def speedup(self) -> float:
        return self.rate2 / self.rate1

    @property
    def spread(self) -> float:
        """The largest relative distance of a round's speedup from the median's."""
        each = [a.tokens_per_s / b.tokens_per_s for a, b in zip(self.d2, self.d1, strict=True)]
        return max(abs(x / self.speedup - 1) for x in each)


def sweep(rounds: int, host_step: float, floor: float, ratios: list[float],
          kind: str | None = None) -> list[Point]:
    points = []
    for ratio in ratios:
        # The queue is busy `floor` per step with nothing configured: below d = floor no
        # configured time gets there (the point then says what d/h it measured).
        delay = max(0.0, ratio * host_step - floor)
        d2, d1 = steady(rounds, delay, kind)
        ours, drain, gap = churn(delay, kind)
        p = Point(ratio, delay, d2, d1, ours, drain, gap)
        print(f"  d/h {ratio:<5g} (measured: h {p.host_s * 1e3:5.2f} ms, d {p.device_s * 1e3:5.2f}"
              f" ms, d/h {p.device_s / p.host_s:.2f}; the device's CPU w "
              f"{p.work_s * 1e3:4.2f} ms; the host's CPU per step at depth 1 "
              f"{p.host_cpu[0] * 1e3:4.2f} ms, at depth 2 {p.host_cpu[1] * 1e3:4.2f} ms) "
              f"depth 2 {p.rate2:>6,.0f} tok/s, depth 1 "
              f"{p.rate1:>6,.0f} tok/s: speedup {p.speedup:.2f}x (rounds within "
              f"{p.spread:.0%}), ideal (h+d)/max(h,d) {p.ideal:.2f}x: {p.speedup / p.ideal:.0%}"
              f" of it; churn: overlapped ours {ours.overlapped:.1%}, drain "
              f"{drain.overlapped:.1%}", flush=True)
        points.append(p)
    return points


def _arguments() -> tuple[argparse.Namespace, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs per configuration and point, medians (default %(default)s)")
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS),
                        help="device/host time ratios of the sweep (default %(default)s)")
    parser.add_argument("--switch-interval", type=float, default=0.0002,
                        help="sys.setswitchinterval for the run (seconds)")
    parser.add_argument("--device", choices=DEVICES, default="process",
                        help="where the emulated device's queues run (default %(default)s); the "
                             "sweep is also run on the other one, for comparison")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the sweep's figures there (`ttmirror report "
                             "--bench-engine FILE` plots them)")
    add_pin(parser, default=None, why="default: where this process may run on two cores or more")
    args = parser.parse_args()
    try:
        ratios = [float(r) for r in args.ratios.split(",")]
    except ValueError:
        parser.error(f"--ratios must be numbers separated by commas, got {args.ratios!r}")
    if args.rounds < 1 or not ratios or min(ratios) <= 0:
        parser.error("--rounds must be 1 or more and every ratio above 0")
    PIN[:] = split_cores(parser, args.pin) or []
    return args, ratios


@dataclass
class Results:
    """Everything one run of the benchmark measured."""

    device: str
    other: str
    points: list[Point]
    compared: list[Point]
    logprobs: Logprobs
    recorded: float
    bare: float
    drafts: list[Drafted]


def main() -> None:
    args, ratios = _arguments()
    # The emulated device's workers share the host's GIL (a chip does not): hand it over
    # quickly, or a finished command waits up to the default 5 ms to be noticed.
    sys.setswitchinterval(args.switch_interval)
    DEVICE[0] = args.device
    other = next(k for k in DEVICES if k != args.device)
    host_step, floor = calibrate(args.rounds)
    where = ("a device process of its own" if args.device == "process"
             else "a worker thread per CQ in the host's process")
    print(
        f"emulated TT device, its queues in {where}"
        + (f" (host on core {min(PIN[0])}, device process on {sorted(PIN[1])})" if PIN else "")
        + f"; probe model, {ROWS} rows; host step h "
        f"{host_step * 1e3:.2f} ms, the device's time d {floor * 1e3:.2f} ms per step with no "
        f"configured time (its emulated kernels; d/h cannot go below {floor / host_step:.2f}); "
        f"median of {args.rounds} rounds per point; tokens identical at depth 2 and 1"
    )
    print("sweep of the device/host time ratio:")
    points = sweep(args.rounds, host_step, floor, ratios)
    print(f"the same sweep with the queues on {other} (for comparison):")
    other_step, other_floor = calibrate(args.rounds, other)
    compared = sweep(args.rounds, other_step, other_floor, ratios, other)
    delay = max(0.0, host_step - floor)  # d = h for the rest
    lp = with_logprobs(args.rounds, delay)
    rec_rate, bare_rate = recording(args.rounds, delay)
    r = Results(args.device, other, points, compared, lp, rec_rate, bare_rate,
                drafted(args.rounds, delay))
    _print_sections(r)
    _print_targets(r)
    if args.json:
        _write_json(Path(args.json), args.rounds, r)
    _print_ratios(r)


def _print_sections(r: Results) -> None:
    """Logprobs, the event log, drafts, churn and validation, one line each."""
    lp, base = r.logprobs, r.drafts[0]
    print(
        f"logprobs (top {LOGPROBS}, every request; d = h): depth 2 {lp.rate(True):,.0f} tok/s, "
        f"without {lp.rate(False):,.0f} tok/s (tokens identical), at least {lp.overlapped:.1%} "
        f"of steps overlapped; {lp.why()}"
    )
    print(
        f"event log (trace validation; d = h): depth 2 {r.recorded:,.0f} tok/s recording, "
        f"{r.bare:,.0f} tok/s without"
    )
    for d in r.drafts:
        print(f"drafts K={d.k} (d = h): depth 2 {d.rate(2):,.0f} tok/s, {d.per_step(2):.2f} "
              f"tokens/step, {d.step_ms(2):.2f} ms/step; depth 1 {d.rate(1):,.0f} tok/s, "
              f"{d.per_step(1):.2f} tokens/step, {d.step_ms(1):.2f} ms/step"
              + (f"; acceptance {d.acceptance:.1%}; over K=0: depth 2 "
                 f"{d.rate(2) / base.rate(2):.2f}x, depth 1 {d.rate(1) / base.rate(1):.2f}x"
                 if d.k else " (no drafts)"))
    gap = max(p.gap for p in r.points)
    launches = r.points[0].ours.outcome.stats["launches"]
    print(f"churn: {launches} steps per run, layout never the same for more than {gap} steps")
    print(f"validated: {VALIDATED['runs']} runs (every recording one, depth 2 and depth 1), "
          f"{VALIDATED['events']:,} events, each a transition of the model")


def _print_targets(r: Results) -> None:
    """The targets, met or not, and where a point falls short of or beats its ideal, why."""
    points = r.points
    shares = [p.speedup / p.ideal for p in points]
    churned = all(p.ours.overlapped >= 0.95 for p in points)
    recorded = r.recorded >= 0.95 * r.bare
    short = [p for p in points if p.speedup < TARGET * p.ideal]
    print(f"targets: every ratio's speedup >= {TARGET:.0%} of its ideal: "
          f"{'met' if not short else 'NOT met'} (lowest {min(shares):.0%}); >= 95% overlapped "
          f"under churn at every ratio: {'met' if churned else 'NOT met'}; recording costs "
          f"under 5% tokens/s: {'met' if recorded else 'NOT met'}")
    if short:
        # Why, in figures: on threads, no engine overlaps the device's CPU with the host's on
        # one GIL; in a process of its own, the two share this machine's cores.
        why = (": the emulated kernels run in Python threads that share the host's GIL, so at "
               "depth 2 they take turns with the host's work instead of overlapping it"
               if r.device == "threads" else
               f": the device process and the host share this machine's {os.cpu_count()} cores "
               "with everything else running on it")
        print("short of the ideal at d/h " + ", ".join(
            f"{p.ratio:g} (the device's CPU w is {p.work_s / p.host_s:.0%} of h)" for p in short)
            + why)
    above = [p for p in points if p.speedup > p.ideal]
    if above:
        # The ideal takes h from depth 1: where depth 2's host does less per step, it beats it.
        print("above the ideal at d/h " + ", ".join(
            f"{p.ratio:g} (the host's CPU per step {p.host_cpu[0] * 1e3:.2f} ms at depth 1, "
            f"{p.host_cpu[1] * 1e3:.2f} ms at depth 2)" for p in above)
            + ": the ideal assumes depth 2's host does depth 1's host work per step, and here "
            "it does less")


def _write_json(path: Path, rounds: int, r: Results) -> None:
    """The sweep's figures, for `ttmirror report --bench-engine FILE`."""
    base = r.drafts[0]
    path.write_text(json.dumps({
        "rounds": rounds, "device": r.device,
        "compared": {"device": r.other, "points": [
            {"ratio": q.ratio, "speedup": q.speedup, "ideal": q.ideal} for q in r.compared]},
        "points": [{"ratio": p.ratio, "measured_ratio": p.device_s / p.host_s,
                    "host_s": p.host_s, "device_s": p.device_s, "work_s": p.work_s,
                    "speedup": p.speedup, "ideal": p.ideal, "spread": p.spread,
                    "overlapped": p.ours.overlapped, "overlapped_drain": p.drain.overlapped}
                   for p in r.points],
        "logprobs_ratio": r.logprobs.rate(True) / r.logprobs.rate(False),
        "recording_ratio": r.recorded / r.bare,
        "drafts": [{"spec_tokens": d.k, "depth2_tok_s": d.rate(2), "depth1_tok_s": d.rate(1),
                    "depth2_tokens_per_step": d.per_step(2),
                    "depth1_tokens_per_step": d.per_step(1), "acceptance": d.acceptance,
                    "depth2_over_no_drafts": d.rate(2) / base.rate(2),
                    "depth1_over_no_drafts": d.rate(1) / base.rate(1)} for d in r.drafts],
    }, indent=1))


def _print_ratios(r: Results) -> None:
    """The last line: every ratio the run measured side by side."""
    base, lp = r.drafts[0], r.logprobs
    print(f"ratios: depth2/depth1 tokens/s over ideal ({r.device}): " + "; ".join(
        f"d/h {p.ratio:g}: {p.speedup:.2f}x / {p.ideal:.2f}x" for p in r.points)
        + f"; share of the ideal, {r.device} / {r.other}: " + ", ".join(
            f"d/h {p.ratio:g}: {p.speedup / p.ideal:.0%} / {q.speedup / q.ideal:.0%}"
            for p, q in zip(r.points, r.compared, strict=True))
        + f"; with/without logprobs {lp.rate(True) / lp.rate(False):.2f}x; recording/not "
        f"{r.recorded / r.bare:.2f}x; overlapped under churn ours/drain " + ", ".join(
            f"{p.ours.overlapped / max(p.drain.overlapped, 1e-9):.2f}x" for p in r.points)
        + "; drafts/none depth 2, depth 1: " + ", ".join(
            f"K={d.k} {d.rate(2) / base.rate(2):.2f}x, {d.rate(1) / base.rate(1):.2f}x"
            for d in r.drafts[1:]))


if __name__ == "__main__":
    main()

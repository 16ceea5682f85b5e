"""Serving throughput at depth 2 vs depth 1, and overlap under batch-layout churn vs draining.

All on the emulated TT device with a real worker thread per command queue (ThreadedScheduler),
so device work runs while the host builds the next step. Each step's decoder op holds its queue
for a calibrated time equal to the host's own per-step time (measured first, in this run), the
regime where pipelining matters: a chip's forward and the host's scheduling cost the same.

1. Tokens/s of the same workload at depth 2 (async) and depth 1 (sync), interleaved rounds,
   medians: the pipeline hides one of the two.
2. The same at depth 2 with every request asking for its top-3 logprobs (the logprob ring beside
   the ids, its program after the sampler, its copy under the ids' event) beside without: what
   the second payload costs, and that depth 2 still overlaps with it.
3. The same with the runner's event log (what trace validation reads) on, its default, and off.
4. A churn workload (a request arrives every 2 steps and short ones finish, so the batch layout
   changes at least every 3 steps; checked): the fraction of launches that overlapped a step
   still in flight, with our design (the mirror combines across layout changes) and with the TT
   plugin's policy (drain every in-flight step when the layout changes).

Every run that records its events (all but the recording-off ones of 3) is then validated
against the model, outside its timing; a divergence exits 1. The last line prints the ratios.
Usage: python benchmarks/bench_engine.py [--rounds R]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import dataclass, replace

import ttnn

from ttmirror.conformance.validate import bounds_of, validate
from ttmirror.impl.device import Emulator, ThreadedScheduler, open_device
from ttmirror.impl.probe import ProbeSpec
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.workload import Outcome, RequestPlan, run_workload

MODEL = ProbeDecoder(ProbeSpec(seed=5))
VALIDATED = {"runs": 0, "events": 0}
"""Every run that records its events is validated against the model (a divergence exits 1)."""
ROWS = 8
LOGPROBS = 3


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

    @property
    def tokens_per_s(self) -> float:
        return self.outcome.generated / self.outcome.seconds

    @property
    def overlapped(self) -> float:
        s = self.outcome.stats
        return s.get("overlapped_launches", 0) / max(1, s.get("launches", 0))


def serve(
    plan: list[RequestPlan], mode: str, delay_s: float, drain: bool = False,
    logprobs: int = 0, record: bool = True,
) -> Measured:
    device = open_device(
        num_command_queues=2,
        emulator=Emulator(
            scheduler=lambda: ThreadedScheduler({"decoder_forward": delay_s}), hazard_mode="raise"
        ),
        emulated=True,
    )
    backend = ServingBackend(TtBackend(device), MODEL)
    engine = ServingEngine(
        backend, ServingConfig(async_scheduling=mode, rows=ROWS, drain_on_layout_change=drain,
                               max_logprobs=logprobs, record_events=record)
    )
    if logprobs:
        plan = [replace(p, sampling=SamplingParams(logprobs=logprobs)) for p in plan]
    layouts: list[tuple[int, ...]] = []

    def record(e: ServingEngine) -> None:
        if e.runner.steps > len(layouts):
            layouts.append(e.last_layout)

    outcome = run_workload(engine, plan, on_step=record)
    outcome.stats["device_compute_s"] = getattr(backend.context, "compute_s", 0.0)
    if engine.runner.events.enabled:  # outside the timed run: validation is not its cost
        events = engine.runner.events.events
        d = validate(events, bounds_of(events))
        if d is not None:
            raise SystemExit(f"bench-engine: a {mode} run {d.line()}")
        VALIDATED["runs"] += 1
        VALIDATED["events"] += len(events)
    engine.close()
    hazards = device.hazards.total
    ttnn.close_mesh_device(device)
    assert hazards == 0, device.hazards.counts
    return Measured(outcome, layouts)


def longest_same_layout(layouts: list[tuple[int, ...]]) -> int:
    longest = run = 1
    for before, after in itertools.pairwise(layouts):
        run = run + 1 if before == after else 1
        longest = max(longest, run)
    return longest


def calibrate() -> tuple[float, float]:
    """The host's time per step (a sync run's step time, less the decoder op's own compute), and
    that compute; the decoder op then occupies the queue that long, so device == host per step."""
    serve(steady_plan(4), "off", 0.0)  # warm: program cache, torch kernels
    bare = serve(steady_plan(), "off", 0.0).outcome
    steps = bare.stats["launches"]
    compute = bare.stats["device_compute_s"] / steps
    return bare.seconds / steps - compute, compute


def steady(rounds: int, delay: float) -> tuple[float, float]:
    """Median tokens/s at depth 2 and at depth 1, interleaved so drift hits both alike."""
    d2, d1 = [], []
    for _ in range(rounds):
        d2.append(serve(steady_plan(), "auto", delay))
        d1.append(serve(steady_plan(), "off", delay))
    for a, b in zip(d2, d1, strict=True):
        assert a.outcome.tokens == b.outcome.tokens, "depth 2 and depth 1 tokens differ"
    return (
        statistics.median(m.tokens_per_s for m in d2),
        statistics.median(m.tokens_per_s for m in d1),
    )


def with_logprobs(rounds: int, delay: float) -> tuple[float, float, float]:
    """Median depth-2 tokens/s with every request asking for logprobs and without, and the
    fraction of launches that overlapped with them, interleaved."""
    on, off = [], []
    for _ in range(rounds):
        on.append(serve(steady_plan(), "auto", delay, logprobs=LOGPROBS))
        off.append(serve(steady_plan(), "auto", delay))
    for a, b in zip(on, off, strict=True):
        assert a.outcome.tokens == b.outcome.tokens, "logprobs changed the tokens"
        assert all(len(v) == len(a.outcome.tokens[r]) for r, v in a.outcome.logprobs.items())
    return (
        statistics.median(m.tokens_per_s for m in on),
        statistics.median(m.tokens_per_s for m in off),
        min(m.overlapped for m in on),
    )


def recording(rounds: int, delay: float) -> tuple[float, float]:
    """Median depth-2 tokens/s with the runner's event log on (the default) and off."""
    on, off = [], []
    for _ in range(rounds):
        on.append(serve(steady_plan(), "auto", delay))
        off.append(serve(steady_plan(), "auto", delay, record=False))
    assert all(a.outcome.tokens == b.outcome.tokens for a, b in zip(on, off, strict=True))
    return (statistics.median(m.tokens_per_s for m in on),
            statistics.median(m.tokens_per_s for m in off))


def churn(delay: float) -> tuple[Measured, Measured, int]:
    """Our engine and the drain-on-layout-change policy on a workload whose rows keep moving;
    returns both and the longest run of steps with one layout."""
    ours = serve(churn_plan(), "auto", delay)
    drain = serve(churn_plan(), "auto", delay, drain=True)
    assert ours.outcome.tokens == drain.outcome.tokens, "the drain policy changed the tokens"
    gap = max(longest_same_layout(ours.layouts), longest_same_layout(drain.layouts))
    assert gap <= 3, f"the churn workload kept one layout for {gap} steps"
    return ours, drain, gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--switch-interval", type=float, default=0.0002,
                        help="sys.setswitchinterval for the run (seconds)")
    args = parser.parse_args()
    # The emulated device's workers share the host's GIL (a chip does not): hand it over
    # quickly, or a finished command waits up to the default 5 ms to be noticed.
    sys.setswitchinterval(args.switch_interval)

    host_step, compute = calibrate()
    delay = host_step
    rate2, rate1 = steady(args.rounds, delay)
    lp_rate, plain_rate, lp_overlap = with_logprobs(args.rounds, delay)
    rec_rate, bare_rate = recording(args.rounds, delay)
    ours, drain, gap = churn(delay)
    launches = ours.outcome.stats["launches"]

    print(
        f"emulated TT device, worker thread per CQ; probe model, {ROWS} rows; host step "
        f"{host_step * 1e3:.2f} ms, decoder op held {delay * 1e3:.2f} ms per step "
        f"(its compute {compute * 1e3:.2f} ms)"
    )
    print(
        f"steady: depth 2 {rate2:,.0f} tok/s, depth 1 {rate1:,.0f} tok/s "
        f"(median of {args.rounds}; tokens identical)"
    )
    print(
        f"logprobs (top {LOGPROBS}, every request): depth 2 {lp_rate:,.0f} tok/s, without "
        f"{plain_rate:,.0f} tok/s (median of {args.rounds}; tokens identical), at least "
        f"{lp_overlap:.1%} of steps overlapped"
    )
    print(
        f"event log (trace validation): depth 2 {rec_rate:,.0f} tok/s recording, "
        f"{bare_rate:,.0f} tok/s without (median of {args.rounds})"
    )
    print(
        f"churn ({launches} steps, layout never the same for more than {gap} steps): "
        f"overlapped steps ours {ours.overlapped:.1%} ({ours.tokens_per_s:,.0f} tok/s), "
        f"drain-on-layout-change {drain.overlapped:.1%} ({drain.tokens_per_s:,.0f} tok/s, "
        f"{drain.outcome.stats.get('engine_drains', 0)} drains)"
    )
    print(f"validated: {VALIDATED['runs']} runs (every recording one, depth 2 and depth 1), "
          f"{VALIDATED['events']:,} events, each a transition of the model")
    met = rate2 >= 1.3 * rate1 and ours.overlapped >= 0.95 and rec_rate >= 0.95 * bare_rate
    print(f"targets (depth 2 >= 1.3x depth 1, >= 95% overlapped under churn, recording costs "
          f"under 5% tokens/s): {'met' if met else 'NOT met'}")
    print(
        f"ratios: depth2/depth1 tokens/s = {rate2 / rate1:.2f}x; with/without logprobs "
        f"{lp_rate / plain_rate:.2f}x; recording/not {rec_rate / bare_rate:.2f}x; "
        f"overlapped steps under churn "
        f"ours {ours.overlapped:.1%} vs drain {drain.overlapped:.1%} "
        f"({ours.overlapped / max(drain.overlapped, 1e-9):.2f}x)"
    )


if __name__ == "__main__":
    main()

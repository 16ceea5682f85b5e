"""Trace validation of a long serving run: a recorded run of 10,000 steps or more, validated.

The serving loop runs the standard workload at 4x its lengths, repeated (staggered arrivals,
stop tokens, aborts, a KV budget that preempts), on the cpu backend until at least `--steps`
steps ran, recording its events as it goes (as every run does). Then the events are validated
against the model, as `ttmirror validate` does, and timed.

Usage: python benchmarks/bench_validate.py [--steps N]
"""

from __future__ import annotations

import argparse
import time

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.workload import run_workload, standard_plan

TARGET_S = 10.0
SCALE = 4
"""Requests 4x the battery's lengths (24 to 60 tokens): hundreds of requests, not thousands."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    model = ProbeDecoder()
    requests = 8
    while True:  # the workload grows until its run has the steps asked for
        engine = ServingEngine(ServingBackend(CpuBackend(), model),
                               ServingConfig(rows=8, kv_tokens=24 * SCALE))
        started = time.perf_counter()
        out = run_workload(engine, standard_plan(model.vocab, requests, scale=SCALE))
        served = time.perf_counter() - started
        engine.close()
        steps = out.stats["launches"]
        if steps >= args.steps:
            break
        requests = int(requests * args.steps / max(steps, 1) * 1.1) + 8
    events = engine.runner.events.events
    started = time.perf_counter()
    bounds = bounds_of(events)
    d = validate(events, bounds)
    seconds = time.perf_counter() - started
    assert d is None, f"the run left the model at event {d.index + 1}: {d.reason}"
    print(f"serving run: {requests} requests, {steps:,} steps, {out.generated:,} tokens, "
          f"{out.stats['kv_preemptions']} preemptions, {len(events):,} events, served in "
          f"{served:.1f} s")
    print(f"validated: {len(events):,} events in {seconds:.2f} s "
          f"({len(events) / seconds:,.0f} events/s, {steps / seconds:,.0f} steps/s)")
    print(f"target ({args.steps:,} steps in under {TARGET_S:.0f} s): "
          f"{'met' if seconds < TARGET_S else 'NOT met'} ({seconds / TARGET_S:.2f}x the limit)")


if __name__ == "__main__":
    main()

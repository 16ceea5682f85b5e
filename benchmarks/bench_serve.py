"""vLLM's own load client against `vllm serve` on the TT mirror: async over sync, measured.

For each configuration (async scheduling on and off; without drafts and with K drafts) one
`vllm serve` runs on the mirror (the emulated device off hardware), and vLLM's own client,
`vllm bench serve`, sends it the random dataset at several request rates and concurrencies
with vLLM's default sampling (temperature 1.0, no seed: each request draws its seed at arrival).
It prints vLLM's own figures per point (completed and failed requests, request throughput,
output tokens/s, median TTFT and TPOT), then async over sync as ratios, each measured in this
one run, and where each configuration's time went (vLLM's process, the socket, the worker's
host work, the wait on the device's readbacks). Every server's events are validated against
the model afterwards; a failed request or a run that leaves the model fails the benchmark
(exit 1).

Usage: python benchmarks/bench_serve.py [--model probe] [--prompts 48] [--quick] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.serving.catalog import TINY_ARCHS
from ttmirror.serving.models import write_model_dir
from ttmirror.vllm_serve import Server

POINTS: tuple[tuple[float, int], ...] = ((math.inf, 1), (math.inf, 4), (8.0, 8))
"""(request rate per second, max concurrency): one request at a time, four at once, and an
arrival rate of 8/s with up to 8 in flight."""
CONFIGS: tuple[tuple[bool, int], ...] = ((True, 0), (False, 0), (True, 2), (False, 2))
"""(async scheduling, drafts per row)."""
METRICS = ("completed", "request_throughput", "output_throughput", "median_ttft_ms",
           "median_tpot_ms")
INPUT_LEN, OUTPUT_LEN = 16, 32
MAX_MODEL_LEN = 128
"""Prompts and outputs stay far below it: vLLM trims drafts near max_model_len, which the mirror
does not serve yet (those requests would fail alone)."""


def serve_and_load(model_dir: str, work: Path, async_on: bool, drafts: int, prompts: int,
                   points: tuple[tuple[float, int], ...]) -> dict[str, Any]:
    """One server of this configuration, vLLM's client at each point; the figures per point,
    the events' verdict and how long the server took to start."""
    name = f"{'async' if async_on else 'sync'}-k{drafts}"
    # vLLM's defaults but async scheduling and the context (max_num_seqs: the platform's cap).
    args = ["--async-scheduling" if async_on else "--no-async-scheduling",
            "--max-model-len", str(MAX_MODEL_LEN)]
    if drafts:
        args += ["--speculative-config", json.dumps(
            {"method": "draft_model", "model": model_dir, "num_speculative_tokens": drafts})]
    started = time.perf_counter()
    server = Server(model_dir, work / f"{name}.itf.json", *args)
    startup = time.perf_counter() - started
    figures = {}
    try:
        for rate, concurrency in points:
            out = work / f"{name}-{rate}-{concurrency}.json"
            result = server.bench(out, "--dataset-name", "random", "--num-prompts",
                                  str(prompts), "--random-input-len", str(INPUT_LEN),
                                  "--random-output-len", str(OUTPUT_LEN),
                                  "--request-rate", str(rate),
                                  "--max-concurrency", str(concurrency), "--seed", "0")
            figures[rate, concurrency] = {**{m: result.get(m) for m in METRICS},
                                          "failed": result.get("failed", 0),
                                          "duration": result["duration"]}
    finally:
        events = server.stop()
    d = validate(events, bounds_of(events))
    return {"name": name, "figures": figures, "startup_s": startup, "events": len(events),
            "valid": d is None, "divergence": None if d is None else d.line(),
            "time": where_time_goes(server.summary, sum(f["duration"]
                                                        for f in figures.values()))}


STEP_MESSAGES = ("launch", "collect", "drafts")
"""The messages of serving (not the worker's start or close)."""


def where_time_goes(summary: dict[str, Any], wall: float) -> dict[str, float]:
    """Seconds of the load's wall time by where they went: vLLM's engine core not waiting on
    the worker (its scheduler, detokenizer hand-off, the API process's share of the core),
    the socket (round trips less the worker's handling: pickling, the two processes' wake-ups),
    the worker's host work (planning, staging, launching, applying), and the host waiting on
    the device's readbacks (the emulated device's kernels)."""
    asked = sum(summary.get("asked_s", {}).get(k, 0.0) for k in STEP_MESSAGES)
    seconds = summary.get("seconds", {})
    handled = sum(seconds.get(k, 0.0) for k in STEP_MESSAGES)
    device = seconds.get("readback_wait", 0.0)
    return {"wall": wall, "vllm": wall - asked, "socket": asked - handled,
            "worker": handled - device, "device": device}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["probe", *TINY_ARCHS], default="probe")
    parser.add_argument("--prompts", type=int, default=48, help="requests per point")
    parser.add_argument("--quick", action="store_true",
                        help="async and sync without drafts, at 4 at once only")
    parser.add_argument("--json", help="also write the figures here")
    ns = parser.parse_args()
    if ns.prompts < 1:
        parser.error("--prompts must be at least 1")
    configs = CONFIGS[:2] if ns.quick else CONFIGS
    points = POINTS[1:2] if ns.quick else POINTS
    runs = {}
    with tempfile.TemporaryDirectory(prefix="ttmirror-bench-serve-") as tmp:
        work = Path(tmp)
        model_dir = str(work / "model")
        write_model_dir(ns.model, model_dir)
        for async_on, drafts in configs:
            print(f"== vllm serve {ns.model}, async scheduling {'on' if async_on else 'off'}, "
                  f"{drafts} draft(s): vllm bench serve, {ns.prompts} random prompts "
                  f"({INPUT_LEN} in, up to {OUTPUT_LEN} out) per point", flush=True)
            run = serve_and_load(model_dir, work, async_on, drafts, ns.prompts, points)
            runs[async_on, drafts] = run
            for (rate, concurrency), f in run["figures"].items():
                print(f"  rate {rate:>4} /s, concurrency {concurrency}: {f['completed']} "
                      f"completed, {f['failed']} failed, {f['request_throughput']:.2f} req/s, "
                      f"{f['output_throughput']:.1f} output tok/s, TTFT "
                      f"{f['median_ttft_ms']:.1f} ms, TPOT {f['median_tpot_ms']:.1f} ms "
                      "(medians)", flush=True)
            t = run["time"]
            print("  where the load's " + f"{t['wall']:.1f} s went: " + ", ".join(
                f"{part} {t[part]:.1f} s ({t[part] / t['wall']:.0%})"
                for part in ("vllm", "socket", "worker", "device")), flush=True)
            print(f"  events: {run['events']}, "
                  + ("every one a model transition" if run["valid"]
                     else f"LEFT THE MODEL: {run['divergence']}"), flush=True)
    ok = True
    print("== async over sync, measured in this run (vLLM's figures)")
    for drafts in sorted({k for _, k in configs}):
        a, s = runs[True, drafts]["figures"], runs[False, drafts]["figures"]
        for point in points:
            fa, fs = a[point], s[point]
            print(f"  {drafts} draft(s), rate {point[0]} /s, concurrency {point[1]}: "
                  f"output tok/s {fa['output_throughput'] / fs['output_throughput']:.2f}x, "
                  f"req/s {fa['request_throughput'] / fs['request_throughput']:.2f}x, "
                  f"TPOT {fa['median_tpot_ms'] / fs['median_tpot_ms']:.2f}x, "
                  f"TTFT {fa['median_ttft_ms'] / fs['median_ttft_ms']:.2f}x")
    for run in runs.values():
        for f in run["figures"].values():
            ok &= f["failed"] == 0 and f["completed"] == ns.prompts
        ok &= run["valid"]
    print("every request of every configuration completed, every run validated: "
          + ("yes" if ok else "NO"))
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(
            {run["name"]: {**run, "figures": {f"{r}/{c}": f for (r, c), f in
                                              run["figures"].items()}}
             for run in runs.values()}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

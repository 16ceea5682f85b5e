"""Model checking against the manifest, and the Python explorer's speed beside TLC's.

Run by `make bench-check`, in one session:

1. TLC (one worker: breadth-first, so its counterexamples are shortest) at every ``default``
   entry of `specs/manifest.json`, each result checked against the manifest (CI checks the
   ``small`` entries; the explorer's side of every default entry runs in CI too).
2. Speed, at the default bounds and at each ``large`` entry (a million states and more): both
   checkers as whole processes, `ttmirror check --json` and TLC with one worker per core. The
   table gives states, the checker's own seconds, whole-process seconds and states per second,
   and each result is checked against the manifest; the last lines give the ratios measured
   side by side.

Each bound runs both checkers `BENCH_CHECK_ROUNDS` times (default 3), interleaved, and the
table gives medians and every run: on a shared 2-core machine one run can be a tenth off.
`BENCH_CHECK_SIZES=default` skips the large entries (minutes each).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttmirror import manifest
from ttmirror.tlc import run_tlc

ROUNDS = int(os.environ.get("BENCH_CHECK_ROUNDS", "3"))
"""Runs of each checker per bound, interleaved; the table gives medians."""


def python_run(e: manifest.Entry) -> tuple[dict[str, object], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "check", "--json", *e.flags.split()],
        capture_output=True, text=True, check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"bench-check: ttmirror check {e.flags} failed: {done.stderr.strip()}")
    return json.loads(done.stdout), wall


def check_tlc_against_manifest(entries: list[manifest.Entry]) -> list[str]:
    bad: list[str] = []
    for e in entries:
        with tempfile.TemporaryDirectory() as tmp:
            run = run_tlc(e.bounds, Path(tmp))
        found = manifest.tlc_differences(e, run.distinct_states, run.violated, run.trace_len)
        verdict = run.violated or "passes"
        print(f"  {'ok  ' if not found else 'DIFF'}  {e.name:<30} {run.distinct_states:>10,} "
              f"states  {verdict:<34} {run.seconds:6.1f} s", flush=True)
        bad += found
    return bad


def main() -> None:
    entries = manifest.load()
    sizes = set(os.environ.get("BENCH_CHECK_SIZES", "default,large").split(","))
    cores = os.cpu_count() or 1
    print("TLC (one worker) at every default entry of specs/manifest.json:")
    bad = check_tlc_against_manifest([e for e in entries if e.size == "default"])
    speed = [manifest.entry("default"), *(e for e in entries if e.size == "large" and
                                          "large" in sizes)]
    print(f"\nspeed: the explorer ({cores} processes) beside TLC ({cores} workers), one per core "
          "each, whole processes")
    print(f"{'bound':<24} {'checker':<7} {'states':>10} {'seconds':>8} {'process s':>9} "
          f"{'states/s':>9}   (medians of {ROUNDS} interleaved rounds; states/s per process s)")
    ratios = []
    for e in speed:
        py_walls, tlc_walls, py_secs = [], [], []
        for _ in range(ROUNDS):  # interleaved: drift on a shared machine hits both alike
            report, py_wall = python_run(e)
            states = int(report["states"])  # type: ignore[call-overload]
            py_secs.append(float(report["seconds"]))  # type: ignore[arg-type]
            py_walls.append(py_wall)
            if states != e.states or report["violated"] != e.violated:
                bad.append(f"{e.name}: explorer found {states:,} states, {report['violated']}; "
                           f"the manifest says {e.states:,}, {e.violated}")
            with tempfile.TemporaryDirectory() as tmp:
                tlc = run_tlc(e.bounds, Path(tmp), workers=cores, timeout=3600)
            bad += manifest.tlc_differences(e, tlc.distinct_states, tlc.violated, tlc.trace_len)
            tlc_walls.append(tlc.seconds)
        py_wall, py_sec, tlc_wall = (statistics.median(x) for x in (py_walls, py_secs, tlc_walls))
        print(f"{e.name:<24} {'python':<7} {e.states:>10,} {py_sec:>8.2f} {py_wall:>9.2f} "
              f"{e.states / py_wall:>9,.0f}   runs: {', '.join(f'{w:.1f}' for w in py_walls)}")
        print(f"{'':<24} {'TLC':<7} {e.states:>10,} {'':>8} {tlc_wall:>9.2f} "
              f"{e.states / tlc_wall:>9,.0f}   runs: {', '.join(f'{w:.1f}' for w in tlc_walls)}",
              flush=True)
        ratios.append(f"{e.name}: explorer/TLC whole-process time {py_wall / tlc_wall:.2f}x "
                      f"(medians of {ROUNDS}; per round "
                      + ", ".join(f"{p / t:.2f}x" for p, t in zip(py_walls, tlc_walls, strict=True))
                      + ")")
    print("\n".join(ratios))
    for line in bad:
        print(f"MANIFEST: {line}", file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()

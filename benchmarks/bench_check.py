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

`BENCH_CHECK_SIZES=default` skips the large entries (minutes each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttmirror import manifest
from ttmirror.tlc import run_tlc


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
    print(f"\nspeed: the explorer beside TLC ({cores} worker(s), one per core), whole processes")
    print(f"{'bound':<24} {'checker':<7} {'states':>10} {'seconds':>8} {'process s':>9} "
          f"{'states/s':>9}")
    ratios = []
    for e in speed:
        report, py_wall = python_run(e)
        states, py_secs = int(report["states"]), float(report["seconds"])  # type: ignore[call-overload, arg-type]
        if states != e.states or report["violated"] != e.violated:
            bad.append(f"{e.name}: explorer found {states:,} states, {report['violated']}; "
                       f"the manifest says {e.states:,}, {e.violated}")
        with tempfile.TemporaryDirectory() as tmp:
            tlc = run_tlc(e.bounds, Path(tmp), workers=cores, timeout=3600)
        bad += manifest.tlc_differences(e, tlc.distinct_states, tlc.violated, tlc.trace_len)
        print(f"{e.name:<24} {'python':<7} {states:>10,} {py_secs:>8.2f} {py_wall:>9.2f} "
              f"{states / py_secs:>9,.0f}")
        print(f"{'':<24} {'TLC':<7} {tlc.distinct_states:>10,} {'':>8} {tlc.seconds:>9.2f} "
              f"{tlc.distinct_states / tlc.seconds:>9,.0f}", flush=True)
        ratios.append(f"{e.name}: explorer/TLC whole-process time {py_wall / tlc.seconds:.2f}x")
    print("\n".join(ratios))
    for line in bad:
        print(f"MANIFEST: {line}", file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()

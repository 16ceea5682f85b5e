"""The soak subcommand: a long serving run with device faults, checked on data.

    ttmirror soak [--steps N] [--fault-rate F] [--seed S] [--model M] [--traced] [--logprobs N]
                  [--timeout SECONDS] [--clock simulated|threaded] [--device host|process]
                  [--trace FILE] [--json]

Exit codes: 0 every check held, 1 a check failed (the seed and the trace file are printed) or
the serving loop stopped making progress (one line), 2 bad input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ttmirror.cli.arguments import AddParser, UsageError, writable


def register(add_parser: AddParser) -> None:
    """Add `soak` to the `ttmirror` parser."""
    from ttmirror.conformance.soak.config import CLOCKS  # no torch/ttnn import: cheap
    from ttmirror.serving.catalog import TINY_ARCHS

    s = add_parser(
        "soak",
        help="serve for N steps with device faults; count hazards, lost or duplicated tokens "
             "and leaked buffers",
        description="The serving loop at depth 2 on the emulated device: random arrivals, "
        "aborts, preemption, and a device fault armed before about --fault-rate of the steps. "
        "Checks: no hazard, no token lost or duplicated against a sync replay, no device buffer "
        "leaked, and the recorded run validates against the model. On the simulated clock (the "
        "default) a seed replays the run exactly, the device's completion order included.",
    )
    s.add_argument("--steps", type=int, default=2_000,
                   help="steps to schedule before arrivals stop (default %(default)s)")
    s.add_argument("--fault-rate", type=float, default=0.01,
                   help="chance per step that a device fault is armed (default %(default)s)")
    s.add_argument("--seed", type=int, default=0,
                   help="every random choice follows from it (default %(default)s)")
    s.add_argument("--model", choices=("probe", *TINY_ARCHS), default="probe",
                   help="the model served (default %(default)s)")
    s.add_argument("--traced", action="store_true",
                   help="replay the decode step as a captured trace (refused replays join the "
                        "faults)")
    s.add_argument("--timeout", type=float, default=1.0,
                   help="seconds the host waits for a readback before it fails the step; a "
                        "late read lands once the host gave up (threaded: 1.5 times that after "
                        "issue) (default %(default)s)")
    s.add_argument("--clock", choices=CLOCKS, default="simulated",
                   help="simulated: the device completes commands on a seeded simulated clock "
                        "in the host's thread, so --seed replays the run exactly; threaded: a "
                        "worker thread per command queue, real concurrency, not replayable "
                        "(default %(default)s)")
    s.add_argument("--device", choices=("host", "process"), default="host",
                   help="where the emulated device's queues and kernels run: the host's process, "
                        "or a device process of their own (simulated clock: each command run "
                        "there when the clock completes it, so --seed still replays) (default "
                        "%(default)s)")
    s.add_argument("--logprobs", type=int, default=3,
                   help="top logprobs a request may ask for: about half the requests ask, and "
                        "every delivered token's logprobs are checked against the sync replay; "
                        "0 turns the logprob ring off (default %(default)s)")
    s.add_argument("--trace", default=None,
                   help="write the run's events here as an ITF trace (default: a temporary file, "
                        "kept only when a check fails)")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object (steps, faults, hazards, lost_tokens, "
                        "duplicated_tokens, leaked_buffers, seconds, ...)")
    s.set_defaults(func=cmd_soak)


def cmd_soak(ns: argparse.Namespace) -> int:
    from ttmirror.conformance.soak.config import SoakConfig

    try:
        cfg = SoakConfig(steps=ns.steps, fault_rate=ns.fault_rate, seed=ns.seed, model=ns.model,
                         trace=ns.traced, readback_timeout_s=ns.timeout, logprobs=ns.logprobs,
                         clock=ns.clock, device=ns.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    writable(ns.trace)  # before any work: a bad path must not cost the run
    keep = ns.trace is not None
    path = Path(ns.trace) if keep else Path(
        tempfile.mkstemp(prefix=f"ttmirror-soak-{cfg.seed}-", suffix=".itf.json")[1])

    from ttmirror.conformance.soak.run import run_soak, summary
    from ttmirror.serving.engine import NoProgress

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        report = run_soak(cfg, path, progress=progress)
    except NoProgress as e:  # a livelock: one line, exit 1, the seed to reproduce it
        print(f"ttmirror: error: the soak stopped (seed {cfg.seed}): {e}", file=sys.stderr)
        if not keep:
            path.unlink(missing_ok=True)
        return 1
    if not keep and report.ok():
        path.unlink(missing_ok=True)
        report.trace_file = ""
    if ns.json:
        print(json.dumps(report.as_json(), indent=1))
    else:
        print("\n".join(summary(report)))
    return 0 if report.ok() else 1

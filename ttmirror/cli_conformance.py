"""Subcommands for the conformance suite: fuzz, mutants and replay.

    ttmirror fuzz    [--backend tt|cpu] [--examples N] [--seed S] [--seconds T] [--min-edges F]
                     [--jobs N] [--profile ci|dev|nightly] [--traces DIR] [--json] [bounds]
    ttmirror mutants [--backend tt|cpu] [--bug ID ...] [--walk-seconds T] [--traces DIR] [--json]
    ttmirror replay  TRACE.json [--backend tt|cpu] [--bug ID]

Exit codes: 0 conforms (and coverage met), 1 a failure or a survivor or coverage below the
minimum, 2 bad input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for real inside the commands: they load torch and ttnn
    from .conformance.coverage import Coverage
    from .conformance.walks import Report


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add fuzz, mutants and replay to the `ttmirror` parser."""
    from .cli import _bounds_args

    f = sub.add_parser("fuzz", help="state machine + guided walks in lockstep with the model")
    _bounds_args(f)
    f.add_argument("--backend", choices=("tt", "cpu"), default="tt",
                   help="tt: the emulated device (a chip if present); cpu (default %(default)s)")
    f.add_argument("--examples", type=int, default=200,
                   help="Hypothesis examples before the guided walks (default %(default)s)")
    f.add_argument("--seed", type=int, default=0, help="the one seed (default %(default)s)")
    f.add_argument("--seconds", type=float, default=3600.0,
                   help="most seconds of guided walks; they stop sooner once --min-edges is "
                   "reached (default %(default)s)")
    f.add_argument("--min-edges", type=float, default=0.95,
                   help="walk until this edges_covered; fail below it (default %(default)s)")
    f.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes replaying the walks (default: the cores, %(default)s)")
    f.add_argument("--profile", choices=("ci", "dev", "nightly"), default=None,
                   help="Hypothesis profile (default $TTMIRROR_PROFILE, else ci)")
    f.add_argument("--traces", default="out/traces",
                   help="directory for failure traces (default %(default)s)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=cmd_fuzz)

    m = sub.add_parser("mutants", help="kill matrix: the suite against every planted bug")
    m.add_argument("--backend", choices=("tt", "cpu"), default="tt")
    m.add_argument("--bug", action="append", default=None, help="only this bug (repeatable)")
    m.add_argument("--profile", choices=("ci", "dev", "nightly"), default="ci")
    m.add_argument("--walk-seconds", type=float, default=60.0,
                   help="guided-walk budget per bug that Hypothesis missed (default %(default)s)")
    m.add_argument("--traces", default=None, help="directory for the shrunk traces")
    m.add_argument("--json", action="store_true", help="print a JSON list")
    m.set_defaults(func=cmd_mutants)

    r = sub.add_parser("replay", help="re-run an ITF trace against model and implementation")
    r.add_argument("trace", help="an ITF trace written by fuzz, mutants or the test suite")
    r.add_argument("--backend", choices=("tt", "cpu"), default=None,
                   help="override the trace's backend")
    r.add_argument("--bug", default=None, help="plant this bug while replaying "
                   "(default: $TTMIRROR_BUG, else none)")
    r.set_defaults(func=cmd_replay)


def cmd_fuzz(ns: argparse.Namespace) -> int:
    import gc

    from .cli import UsageError, _bounds

    bounds = _bounds(ns)
    if bounds.release_at != "complete":
        raise UsageError("--release-at issue has no implementation counterpart; use "
                         "`ttmirror mutants --bug release-at-issue`")
    if ns.examples < 0 or ns.seconds < 0 or not 0 <= ns.min_edges <= 1 or ns.jobs < 1:
        raise UsageError("--examples and --seconds must be >= 0, --jobs >= 1, --min-edges in "
                         "[0, 1]")
    # Checked before the imports below: they load torch and ttnn, which take seconds.
    from .conformance import campaign, itf, profiles, walks
    from .conformance.coverage import Coverage
    from .impl import faults
    from .model.explore import explore

    trace_dir = Path(ns.traces)
    start = time.perf_counter()
    cov = Coverage(explore(bounds))
    gc.freeze()  # the graph lives to the end: keep the collector from rescanning it
    explored = time.perf_counter()
    failure_path: Path | None = None
    failure_msg: str | None = None
    _say(f"explored {cov.total_edges:,} edges in {explored - start:.0f} s; "
         f"Hypothesis: {ns.examples} examples")
    result = campaign.run(bounds, ns.backend, profiles.profile(ns.profile), seed=ns.seed,
                          trace_dir=trace_dir, on_run=cov.record,
                          max_examples=max(1, ns.examples))
    walked = walks.Report(jobs=ns.jobs)
    if result.failed:
        failure_path, failure_msg = result.trace_path, result.error
    else:
        _say(f"Hypothesis: {result.examples} examples, edges_covered {cov.edges_covered:.4f}; "
             f"guided walks on {ns.jobs} worker(s) until {ns.min_edges}")
        walked = walks.run(cov, ns.backend, seed=ns.seed, until=ns.min_edges,
                           seconds=ns.seconds, jobs=ns.jobs, progress=_walk_progress,
                           every=10.0 if sys.stderr.isatty() else 30.0)
        if walked.failure is not None:
            failed = walked.failure
            trace = itf.to_itf(bounds, ns.backend, failed.prompts, failed.moves, failed.states,
                               failure=failed.error, bug=faults.current(), seed=ns.seed)
            failure_path = itf.write(
                trace_dir / f"walk-{ns.backend}-seed{ns.seed}-walk{failed.walk}.itf.json", trace)
            failure_msg = str(failed.error)
    seconds = time.perf_counter() - explored
    report = {
        "backend": ns.backend,
        "bounds": bounds._asdict(),
        "seed": ns.seed,
        "actions_covered": round(cov.actions_covered, 4),
        "edges_covered": round(cov.edges_covered, 4),
        "edges": len(cov.edges),
        "total_edges": cov.total_edges,
        "steps": cov.steps,
        "steps_per_second": round(cov.steps / seconds, 1) if seconds > 0 else None,
        "seconds": round(seconds, 2),
        "explore_seconds": round(explored - start, 2),
        "hypothesis_examples": result.examples,
        "walks": walked.walks,
        "jobs": ns.jobs,
        "stopped": walked.stopped or ("failure" if result.failed else ""),
        "min_edges": ns.min_edges,
        "failure": failure_msg,
        "trace": str(failure_path) if failure_path else None,
    }
    ok = failure_msg is None and cov.actions_covered == 1.0 and cov.edges_covered >= ns.min_edges
    if ns.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>19}: {value}")
    if failure_msg is not None:
        print(f"ttmirror: conformance failure with seed {ns.seed}; trace {failure_path}; "
              f"replay with `ttmirror replay {failure_path}`", file=sys.stderr)
    elif not ok:
        print(f"ttmirror: coverage below the minimum: actions {cov.actions_covered:.3f}, "
              f"edges {cov.edges_covered:.4f} < {ns.min_edges} (walks stopped: "
              f"{walked.stopped}; raise --seconds or --jobs)", file=sys.stderr)
    return 0 if ok else 1


def _say(line: str) -> None:
    print(f"ttmirror fuzz: {line}", file=sys.stderr, flush=True)


def _walk_progress(report: Report, cov: Coverage) -> None:
    rate = report.steps / report.seconds if report.seconds > 0 else 0.0
    _say(f"{report.seconds:6.0f} s  walks {report.walks:,}  edges_covered "
         f"{cov.edges_covered:.4f}  {rate:,.0f} steps/s")


def cmd_mutants(ns: argparse.Namespace) -> int:
    from .cli import UsageError
    from .conformance import mutants, profiles
    from .impl import faults
    from .model.state import Bounds

    for bug in ns.bug or []:
        if bug not in faults.BUGS:
            raise UsageError(f"unknown bug {bug!r}; choose from: {', '.join(faults.BUGS)}")
    kills = mutants.matrix(Bounds(), ns.backend, profiles.profile(ns.profile), bugs=ns.bug,
                           walk_seconds=ns.walk_seconds,
                           trace_dir=Path(ns.traces) if ns.traces else None)
    if ns.json:
        print(json.dumps([k.as_json() for k in kills], indent=1))
    else:
        print(f"{'bug':<26}{'killed':<8}{'by':<12}{'examples':>9}{'seconds':>9}{'trace':>7}")
        for k in kills:
            print(f"{k.id:<26}{'yes' if k.killed else 'NO':<8}{k.by or '-':<12}"
                  f"{k.examples if k.examples is not None else '-':>9}"
                  f"{k.seconds if k.seconds is not None else '-':>9}"
                  f"{k.trace_len if k.trace_len is not None else '-':>7}")
    return 0 if all(k.killed for k in kills) else 1


def cmd_replay(ns: argparse.Namespace) -> int:
    from .cli import UsageError
    from .conformance import itf
    from .conformance.replay import CONFORMS, INVALID, replay
    from .impl import faults

    try:
        loaded = itf.load(Path(ns.trace))
    except itf.TraceError as e:
        raise UsageError(str(e)) from None
    bug = ns.bug if ns.bug is not None else faults.current()
    if bug is not None and bug not in faults.BUGS:
        raise UsageError(f"unknown bug {bug!r}; choose from: {', '.join(faults.BUGS)}")
    backend = ns.backend or loaded.backend
    try:
        with faults.planted(bug):
            outcome = replay(loaded.bounds, backend, loaded.prompts, loaded.moves,
                             claimed=loaded.states[1:])
    except (ValueError, KeyError, IndexError) as e:
        raise UsageError(f"{ns.trace} is not for this model: {e}") from None
    if outcome.status == INVALID:
        raise UsageError(f"{ns.trace} is not a behaviour of this model: {outcome.reason}")
    print(f"replay of {ns.trace} on {backend}" + (f" with bug {bug}" if bug else ""))
    print(f"{'step':>4}  {'move':<28} result")
    for row in outcome.rows:
        print(f"{row.index:>4}  {row.label:<28} {row.outcome}")
    if outcome.status == CONFORMS:
        print(f"conforms: {len(outcome.rows)} moves, no divergence")
        return 0
    d = outcome.divergence
    print(f"first divergence at step {d.step + 1 if d else '?'}: reproduces the failure")
    return 1

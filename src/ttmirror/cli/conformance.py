"""Subcommands for the conformance suite: fuzz, mutants, replay and validate.

    ttmirror fuzz    [--backend tt|cpu] [--examples N] [--seed S] [--seconds T] [--min-edges F]
                     [--jobs N] [--profile ci|dev|nightly] [--traces DIR] [--json] [bounds]
    ttmirror mutants [--backend tt|cpu] [--bug ID ...] [--walk-seconds CAP] [--traces DIR] [--json]
    ttmirror replay  TRACE.json [--backend tt|cpu] [--bug ID]
    ttmirror validate TRACE.json  (a run recorded by the runner, e.g. serve-demo --trace)

Exit codes: 0 conforms (and coverage met), 1 a failure or a survivor or coverage below the
minimum, 2 bad input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmirror.cli.arguments import (
    AddParser,
    UsageError,
    add_bounds,
    bounds_from,
    planted_bug,
    writable_dir,
)
from ttmirror.conformance.bugs import model_only
from ttmirror.model.state import RING, Bounds

if TYPE_CHECKING:  # imported for real inside the commands: they load torch and ttnn
    pass


def register(add_parser: AddParser) -> None:
    """Add fuzz, mutants and replay to the `ttmirror` parser."""
    f = add_parser("fuzz", help="state machine + guided walks in lockstep with the model")
    add_bounds(f)
    f.add_argument("--backend", choices=("tt", "cpu"), default="tt",
                   help="tt: the emulated device (a chip if present); cpu (default %(default)s)")
    f.add_argument("--config", default=None,
                   help="tt: eager-2cq (default), eager-1cq or traced; cpu: host")
    f.add_argument("--examples", type=int, default=200,
                   help="Hypothesis examples before the guided walks (default %(default)s)")
    f.add_argument("--seed", type=int, default=0, help="the one seed (default %(default)s)")
    f.add_argument("--seconds", type=float, default=3600.0,
                   help="most seconds of the whole run (exploration, Hypothesis and its shrinking, "
                   "guided walks); the walks stop sooner once --min-edges is "
                   "reached (default %(default)s)")
    f.add_argument("--min-edges", type=float, default=None,
                   help="walk until this edges_covered; fail below it (default 1.0 where the "
                   "implementation's state can be saved: the emulated device and the cpu "
                   "backend; 0.95 on a chip, where every walk starts at the initial state)")
    f.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes replaying the walks (default: the cores, %(default)s)")
    f.add_argument("--profile", choices=("ci", "dev", "nightly"), default=None,
                   help="Hypothesis profile (default $TTMIRROR_PROFILE, else ci)")
    f.add_argument("--traces", default="out/traces",
                   help="directory for failure traces (default %(default)s)")
    f.add_argument("--shard", default=None, metavar="I/N",
                   help="take shard I of N of the walk plan (a pure function of --seed and the "
                   "bounds): N machines with the same seed take every walk once; merge their "
                   "--json reports with `ttmirror coverage merge`")
    f.add_argument("--database", default=None,
                   help="Hypothesis example database: a folder or redis://HOST:PORT/DB (shared "
                   "by every machine of a campaign; default ${TTMIRROR_DATABASE}, else "
                   ".hypothesis/examples)")
    f.add_argument("--checkpoint", default=None, metavar="FILE",
                   help="save the campaign's progress (edges walked, totals) to FILE every few "
                   "minutes and at the end; if FILE exists, go on from it: its edges count as "
                   "covered and its Hypothesis phase is not repeated (one campaign per file)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=cmd_fuzz)

    c = add_parser("coverage", help="coverage of a campaign's shards")
    sub = c.add_subparsers(dest="coverage_command", metavar="ACTION", parser_class=type(c))
    sub.required = True
    merge = sub.add_parser("merge", help="merge `fuzz --shard --json` reports: the union's "
                           "edges_covered and the walks still needed")
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="`fuzz --json` files")
    merge.add_argument("--json", action="store_true", help="print one JSON object")
    merge.set_defaults(func=cmd_coverage_merge)

    m = add_parser("mutants", help="kill matrix: the suite against every planted bug")
    m.add_argument("--backend", choices=("tt", "cpu"), default="tt")
    m.add_argument("--bug", action="append", default=None, help="only this bug (repeatable)")
    m.add_argument("--config", action="append", default=None,
                   help="only this configuration (repeatable; default: every one of the backend)")
    m.add_argument("--profile", choices=("ci", "dev", "nightly"), default="ci")
    m.add_argument("--walk-seconds", type=float, default=math.inf,
                   help="a cap on the guided walks per bug that Hypothesis missed (default: "
                   "none: they stop at the kill or once every edge is walked, so no clock "
                   "decides a verdict; a cap makes a slow or busy machine report survivors)")
    m.add_argument("--traces", default=None, help="directory for the shrunk traces")
    m.add_argument("--json", action="store_true", help="print a JSON list")
    m.set_defaults(func=cmd_mutants)

    r = add_parser("replay", help="re-run an ITF trace against model and implementation")
    r.add_argument("trace", help="an ITF trace written by fuzz, mutants or the test suite")
    r.add_argument("--backend", choices=("tt", "cpu"), default=None,
                   help="override the trace's backend")
    r.add_argument("--bug", default=None, help="plant this bug while replaying "
                   "(default: $TTMIRROR_BUG, else none)")
    r.add_argument("--config", default=None, help="override the trace's configuration")
    r.set_defaults(func=cmd_replay)

    v = add_parser("validate", help="check a recorded run's events one by one against the model")
    v.add_argument("trace", help="an ITF trace of runner events (serve-demo --trace FILE)")
    v.set_defaults(func=cmd_validate)


def cmd_fuzz(ns: argparse.Namespace) -> int:
    started = time.perf_counter()
    bounds = _fuzz_bounds(ns)
    bug = planted_bug()  # $TTMIRROR_BUG: a campaign against a planted bug
    writable_dir(ns.traces)
    # Checked before the import below: it loads torch and ttnn, which take seconds.
    from ttmirror.conformance.campaigns import fuzz

    result = fuzz.run(fuzz.Options(
        bounds=bounds, backend=ns.backend, config=ns.config, seed=ns.seed, examples=ns.examples,
        started=started, seconds=ns.seconds, min_edges=ns.min_edges, jobs=ns.jobs,
        profile=ns.profile, traces=Path(ns.traces), database=ns.database,
        example_db=ns.example_db, shard=ns.shard, bug=bug,
        walk_mode="from-initial" if ns.shard else _walk_mode(ns.backend),
        progress_every=10.0 if sys.stderr.isatty() else 30.0,
        checkpoint=Path(ns.checkpoint) if ns.checkpoint else None), _say)
    if result.report is not None:
        _print_report(result.report, ns.json)
    if result.failure is not None:
        report = result.report or {}
        seeds = f"seed {ns.seed}" + (f" (Hypothesis seed {report['hypothesis_seed']})"
                                     if report.get("hypothesis_seed", ns.seed) != ns.seed else "")
        print(f"ttmirror: conformance failure with {seeds}; trace {result.failure.path}; "
              f"replay with `ttmirror replay {result.failure.path}`", file=sys.stderr)
    elif result.problem is not None:
        print(f"ttmirror: {result.problem}", file=sys.stderr)
    return 0 if result.ok else 1


def cmd_coverage_merge(ns: argparse.Namespace) -> int:
    """The union of shards' covered edges, on the graph of their (common) bounds."""
    reports = []
    for name in ns.reports:
        try:
            data = json.loads(Path(name).read_text())
            fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                      for k, v in data["bounds"].items()}
            bounds = Bounds(**fields)
            if not isinstance(data["covered_edges"], str) or not isinstance(data["seed"], int):
                raise TypeError("covered_edges must be text and seed a number")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UsageError(f"{name}: not a `ttmirror fuzz --json` report with covered_edges "
                             f"({type(e).__name__}: {e})") from None
        reports.append((name, bounds, data))
    first_name, bounds, first = reports[0]
    for name, other, data in reports[1:]:
        if other != bounds or data["seed"] != first["seed"]:
            raise UsageError(f"{name}: its bounds or seed differ from {first_name}'s: shards of "
                             "one campaign share both")
    from ttmirror.conformance.campaigns import shards
    from ttmirror.conformance.campaigns.coverage import Coverage
    from ttmirror.model.explore import explore

    try:
        merged = shards.merge([d for _, _, d in reports], Coverage(explore(bounds)),
                              seed=first["seed"])
    except ValueError as e:
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(merged, indent=1))
    else:
        print(f"{merged['reports']} reports: edges_covered {merged['edges_covered']:.4f} "
              f"({merged['edges']:,} of {merged['total_edges']:,} edges); walks still needed "
              f"{merged['walks_still_needed']:,}; walks taken {merged['walks_taken']:,}, "
              f"{merged['walks_taken_twice']} of them twice")
    return 0


def _fuzz_bounds(ns: argparse.Namespace) -> Bounds:
    """The bounds and budgets of `fuzz`, checked (a `UsageError` before anything loads)."""
    bounds = bounds_from(ns)
    if (only := model_only(bounds.release_at, bounds.variant)) is not None:
        option, bug = only
        raise UsageError(f"{option} is a model option with no implementation switch; use "
                         f"`ttmirror mutants --bug {bug}`")
    if (ns.examples < 0 or ns.seconds < 0 or ns.jobs < 1
            or (ns.min_edges is not None and not 0 <= ns.min_edges <= 1)):
        raise UsageError("--examples and --seconds must be >= 0, --jobs >= 1, --min-edges in "
                         "[0, 1]")
    ns.config = _config(ns.backend, ns.config)
    if ns.checkpoint is not None:
        if ns.shard is not None:
            raise UsageError("--checkpoint resumes branch walks; a --shard's walks are planned "
                             "from the initial state: merge shards with `ttmirror coverage merge`")
        writable_dir(str(Path(ns.checkpoint).parent))
    if ns.shard is not None:
        from ttmirror.conformance.campaigns.shards import parse_shard  # numpy only

        try:
            ns.shard = parse_shard(ns.shard)
        except ValueError as e:
            raise UsageError(str(e)) from None
    from ttmirror.conformance.campaigns import databases  # hypothesis only: not torch or ttnn

    ns.database = ns.database or os.environ.get(databases.ENV) or databases.DEFAULT
    if "://" not in ns.database:
        writable_dir(ns.database)
    try:
        ns.example_db = databases.open_database(ns.database)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if ns.min_edges is None:
        ns.min_edges = 1.0 if _walk_mode(ns.backend) == "branches" else 0.95
    return bounds


def _walk_mode(backend: str) -> str:
    """branches: each edge walked once from a saved state (the implementation's state can be
    saved); from-initial: every walk starts at the initial state (a chip)."""
    if backend == "cpu":
        return "branches"
    from ttmirror.impl.devices import chip_present

    return "from-initial" if chip_present() else "branches"


def _config(backend: str, config: str | None) -> str:
    from ttmirror.conformance.traces.configs import check_config

    try:
        return check_config(backend, config)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=1))
        return
    for key, value in report.items():
        print(f"{key:>19}: {value}")


def _say(line: str) -> None:
    print(f"ttmirror fuzz: {line}", file=sys.stderr, flush=True)


def cmd_mutants(ns: argparse.Namespace) -> int:
    from ttmirror.conformance import bugs as catalog
    from ttmirror.conformance.campaigns import profiles
    from ttmirror.conformance.kills import matrix as mutants
    from ttmirror.conformance.traces.configs import CONFIGS
    from ttmirror.emulator.allocator import PLANTED

    known = {**catalog.ALL, **PLANTED} if ns.backend == "tt" else catalog.BUGS
    for bug in ns.bug or []:
        if bug not in known:
            raise UsageError(f"unknown bug {bug!r}; choose from: {', '.join(known)}")
    configs = [_config(ns.backend, c) for c in ns.config or CONFIGS[ns.backend]]
    writable_dir(ns.traces)
    lockstep_bugs = [b for b in ns.bug or [] if b in catalog.BUGS]
    serving_bugs = [b for b in ns.bug or [] if b in catalog.SERVING_BUGS]
    fault_bugs = [b for b in ns.bug or [] if b in catalog.FAULT_HANDLING_BUGS]
    allocator_bugs = [b for b in ns.bug or [] if b in PLANTED]
    kills = []
    if not ns.bug or lockstep_bugs:
        kills = mutants.matrix(RING, ns.backend, profiles.profile(ns.profile),
                               bugs=lockstep_bugs or None, configs=configs,
                               walk_seconds=ns.walk_seconds,
                               trace_dir=Path(ns.traces) if ns.traces else None)
    if ns.backend == "tt" and (not ns.bug or serving_bugs):
        # The logprob ring's bugs: found by the serving half, not the lockstep (the probe has
        # no logprobs); no trace file, the serving workload is the reproduction.
        kills += mutants.serving_matrix(serving_bugs or None, configs)
    if ns.backend == "tt" and (not ns.bug or fault_bugs):
        # Fault handling's bugs: found by the fault half (serving runs that meet a device fault).
        kills += mutants.fault_matrix(fault_bugs or None)
    if ns.backend == "tt" and (not ns.bug or allocator_bugs):
        # The emulated device's own planted bugs: its checks must be live too.
        kills += mutants.allocator_matrix(allocator_bugs or None)
    if ns.json:
        print(json.dumps([k.as_json() for k in kills], indent=1))
    else:
        print(f"{'bug':<31}{'config':<11}{'killed':<8}{'layer':<17}{'by':<12}{'examples':>9}"
              f"{'seconds':>9}{'trace':>7}")
        for k in kills:
            print(f"{k.id:<31}{k.config:<11}{'yes' if k.killed else 'NO':<8}"
                  f"{k.layer or k.harness_error or '-':<17}{k.by or '-':<12}"
                  f"{k.examples if k.examples is not None else '-':>9}"
                  f"{k.seconds if k.seconds is not None else '-':>9}"
                  f"{k.trace_len if k.trace_len is not None else '-':>7}")
    return 0 if all(k.killed for k in kills) else 1


def cmd_replay(ns: argparse.Namespace) -> int:
    from ttmirror.conformance.lockstep.replay import CONFORMS, INVALID, replay
    from ttmirror.conformance.traces import itf

    try:
        loaded = itf.load(Path(ns.trace))
    except itf.TraceError as e:
        raise UsageError(str(e)) from None
    bug = planted_bug(ns.bug)
    backend = ns.backend or loaded.backend
    config = _config(backend, ns.config or (loaded.config if backend == loaded.backend else None))
    try:
        outcome = replay(loaded.bounds, backend, loaded.prompts, loaded.moves,
                         claimed=loaded.states[1:], config=config, sampling=loaded.sampling,
                         sampling_seed=loaded.sampling_seed, bug=bug, drafter=loaded.drafter)
    except (ValueError, KeyError, IndexError) as e:
        raise UsageError(f"{ns.trace} is not for this model: {e}") from None
    if outcome.status == INVALID:
        raise UsageError(f"{ns.trace} is not a behaviour of this model: {outcome.reason}")
    print(f"replay of {ns.trace} on {backend} ({config}, {loaded.sampling} sampler)"
          + (f" with bug {bug}" if bug else ""))
    print(f"{'step':>4}  {'move':<28} result")
    for move in outcome.replayed:
        print(f"{move.index:>4}  {move.label:<28} {move.outcome}")
    if outcome.status == CONFORMS:
        print(f"conforms: {len(outcome.replayed)} moves, no divergence")
        return 0
    d = outcome.divergence
    print(f"first divergence at step {d.step + 1 if d else '?'}: reproduces the failure")
    return 1


def cmd_validate(ns: argparse.Namespace) -> int:
    from collections import deque
    from itertools import chain

    from ttmirror.conformance.traces.itf import EventsError, read_events
    from ttmirror.conformance.traces.validate import bounds_of, validate

    path = Path(ns.trace)
    tty = sys.stderr.isatty()
    # The step table's rows: its last six up to the divergence; with drafts validation reads a
    # launch's readback ahead of it (`validate._with_verdicts`), a step or two of events.
    recent: deque[tuple[int, Any]] = deque(maxlen=64)
    counts = {"events": 0, "steps": 0, "requests": 0}

    def seen(events: Any) -> Any:
        for event in events:
            recent.append((counts["events"], event))
            counts["events"] += 1
            counts["steps"] += event.action == "schedule"
            counts["requests"] += event.action == "arrive"
            yield event

    def progress(n: int) -> None:
        if tty:
            print(f"\rvalidating: {n:,} events, {counts['steps']:,} steps...", end="",
                  file=sys.stderr, flush=True)

    started = time.perf_counter()
    try:
        stream = read_events(path)
        first = next(stream)  # read_events raises EventsError for a trace without events
        bounds = bounds_of(first)
        d = validate(seen(chain([first], stream)), bounds, progress)
        if d is not None:
            for _ in stream:  # a divergence in a file that is no trace is a malformed file
                pass
    except OSError as e:
        raise UsageError(f"{ns.trace}: {e.strerror}") from None
    except EventsError as e:
        raise UsageError(f"{ns.trace}: {e}") from None
    finally:
        if tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    drafts = f", {bounds.spec_tokens} draft(s) per row" if bounds.spec_tokens else ""
    summary = (f"{counts['events']} events, {counts['requests']} requests, depth {bounds.depth}, "
               f"K={bounds.slots}{drafts}, {counts['steps']} steps")
    if d is None:
        print(f"valid: {summary}, every event a model transition ({seconds:.2f} s)")
        return 0
    print(f"diverges at event {d.index + 1} ({summary} read): {d.reason}")
    print(f"{'event':>6}  action")
    for i, event in [(i, e) for i, e in recent if i <= d.index][-6:]:
        mark = "  <- here" if i == d.index else ""
        print(f"{i + 1:>6}  {event.action}{tuple(event.args) if event.args else ''}{mark}")
    print(f"model before it: queue {[(q.slot, q.phase.name) for q in d.state.queue]}, requests "
          f"{[r.status.name for r in d.state.requests]}")
    if d.allowed:
        print(f"the model allowed instead: {', '.join(d.allowed)}")
    return 1

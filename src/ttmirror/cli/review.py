"""The report subcommand: the review site a spec reviewer opens in a browser.

    ttmirror report [-o DIR] [--no-tlc] [--no-prove] [--fuzz-seconds S] [--seed N] [--mutants FILE]
                    [--bench-engine FILE] [--traces DIR] [--jobs N] [bounds]

Exit codes: 0 written and every property holds at the bounds, 1 written and something fails
(the report shows what; stderr's last line says "the check failed: " and what), 2 bad input
(one line, no traceback).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ttmirror.cli.arguments import AddParser, UsageError, add_bounds, bounds_from, mkdir
from ttmirror.resources import REGRESSIONS as DEFAULT_TRACES


def register(add_parser: AddParser) -> None:
    """Add `report` to the `ttmirror` parser."""
    r = add_parser(
        "report", help="write the review site: spec, verdicts, graphs, counterexamples, coverage",
        description="A self-contained static site (index.html, its script and style sheet): the "
        "design spec, the verdicts `check --json` prints, the slot and request lifecycle graphs "
        "(click a state to see it whole), each known-bad variant's shortest counterexample as a "
        "stepper, the fuzz's edge coverage on the graphs, the kill matrix and the regression "
        "traces. Everything is computed in this run.")
    add_bounds(r)
    r.add_argument("-o", "--out", default="out/report", help="directory (default %(default)s)")
    r.add_argument("--no-tlc", action="store_true",
                   help="leave TLC's agreement out (it runs when Java is present)")
    r.add_argument("--fuzz-seconds", type=float, default=60.0,
                   help="seconds of guided walks for the coverage (0: none; default %(default)s)")
    r.add_argument("--seed", type=int, default=0, help="the walks' seed (default %(default)s)")
    r.add_argument("--mutants", help="a `ttmirror mutants --json` file: the kill matrix")
    r.add_argument("--bench-engine", metavar="FILE",
                   help="`make bench-engine`'s figures (out/bench-engine.json): plotted")
    r.add_argument("--traces", default=str(DEFAULT_TRACES),
                   help="folder of ITF regression traces (default the repository's)")
    r.add_argument("--jobs", type=int, default=None,
                   help="processes exploring (default one per core)")
    r.add_argument("--no-prove", action="store_true",
                   help="leave out the proof for every size (`ttmirror prove` at the bounds' "
                        "option set)")
    r.set_defaults(func=cmd_report)


def _say(text: str) -> None:
    print(f"report: {text}", file=sys.stderr, flush=True)


def cmd_report(ns: argparse.Namespace) -> int:
    bounds = bounds_from(ns)
    if ns.fuzz_seconds < 0:
        raise UsageError("--fuzz-seconds must be 0 or more")
    if ns.jobs is not None and ns.jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, got {ns.jobs}")
    traces = Path(ns.traces)
    if not traces.is_dir():
        raise UsageError(f"--traces {traces}: not a folder")
    if shutil.which("dot") is None:
        raise UsageError("Graphviz 'dot' not found: install Debian's graphviz package")
    from ttmirror import explore_jobs
    from ttmirror.report import check as check_report
    from ttmirror.report import site as review

    # Read before the work: a bad file must not cost the exploration first.
    try:
        kills = review.kills(Path(ns.mutants) if ns.mutants else None)
        bench = review.bench_engine(Path(ns.bench_engine) if ns.bench_engine else None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = Path(ns.out)
    mkdir(out)
    jobs = ns.jobs or explore_jobs.default_jobs()
    started = time.perf_counter()
    ex = explore_jobs.explore(bounds, jobs)
    check = check_report.as_json(ex)
    _say(f"explored {check['states']:,} states, {check['transitions']:,} transitions")
    tlc = _tlc(bounds, ex) if not ns.no_tlc else None
    proof = _prove(bounds) if not ns.no_prove else None
    coverage, walked = _fuzz(ex, ns.seed, ns.fuzz_seconds, jobs)
    views = [review.slot_view(ex, walked), review.request_view(ex, walked)]
    cexs = []
    for name, about, bad in review.known_bad(bounds):
        cexs.append(review.counterexample(name, about, explore_jobs.explore(bad, jobs)))
    _say(f"{len(cexs)} known-bad variants explored")
    data: dict[str, Any] = {
        "check": check, "tlc": tlc, "proof": proof, "coverage": coverage, "views": views,
        "counterexamples": cexs, "kills": kills, "bench": bench,
        "traces": [review.trace_table(p) for p in sorted(traces.glob("*.itf.json"))],
        "spec": review.spec_html(),
    }
    index = review.write(data, out)
    _say(f"written in {time.perf_counter() - started:.0f} s")
    if not check["passed"]:  # the site is written all the same: it shows what failed
        _say(f"the check failed: {review.failures(check)}")
    print(index.resolve())
    return 0 if check["passed"] else 1


def _tlc(bounds: Any, ex: Any) -> dict[str, Any] | None:
    """TLC's agreement at the bounds, when Java is here; None (and why, on stderr) if not."""
    if shutil.which("java") is None:
        _say("no Java: TLC's agreement left out")
        return None
    import subprocess

    from ttmirror import tlc

    try:
        result = tlc.cross_check(bounds, ex, graph=False)
    except (tlc.TlcError, OSError, subprocess.TimeoutExpired) as e:
        _say(f"TLC failed, left out: {e}")
        return None
    _say(f"TLC: {result['tlc_states']:,} states, verdicts "
         f"{'agree' if result['agree'] else 'DISAGREE'}")
    return result


def _prove(bounds: Any) -> dict[str, Any]:
    """`ttmirror prove` at the option set of the bounds: each obligation and its verdict, and
    any counterexample to induction with its lookup in the explorer."""
    from ttmirror.cli.prove import run_set
    from ttmirror.proof.obligations import RLIMIT
    from ttmirror.proof.relation import Options

    result = run_set(Options.of(bounds), "z3", RLIMIT, lambda line: None)
    bad = sum(o["verdict"] != "holds" for o in result["obligations"])
    _say(f"proof: {len(result['obligations']) - bad} of {len(result['obligations'])} "
         f"obligations hold ({result['seconds']:.0f} s)")
    return result


def _fuzz(ex: Any, seed: int, seconds: float, jobs: int) -> tuple[dict[str, Any] | None,
                                                     set[tuple[int, int]] | None]:
    """Guided walks on the emulated device for `seconds`: the coverage figures and the edges
    walked (None, None for no walks)."""
    if seconds <= 0:
        return None, None
    from ttmirror.conformance.campaigns import branches
    from ttmirror.conformance.campaigns.coverage import Coverage

    cov = Coverage(ex)
    started = time.perf_counter()
    walked = branches.run(cov, "tt", seed=seed, until=1.0, seconds=seconds, jobs=jobs)
    figures = {
        "seed": seed, "seconds": round(time.perf_counter() - started, 1),
        "stopped": walked.stopped, "walks": walked.walks, "jobs": jobs,
        "edges_covered": cov.edges_covered, "actions_covered": cov.actions_covered,
        "walked_edges": len(cov.edges), "total_edges": cov.total_edges,
        "failure": str(walked.failure.error) if walked.failure else None,
    }
    _say(f"walked {len(cov.edges):,} of {cov.total_edges:,} edges ({walked.stopped})")
    return figures, set(cov.edges)

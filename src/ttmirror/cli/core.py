"""The `ttmirror` command line: check the model, draw its graphs, run the demo, describe a backend.

Exit codes: 0 everything holds, 1 a property is violated (or a situation never occurred),
2 bad arguments or input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from ttmirror import explore_jobs
from ttmirror.cli import conformance as cli_conformance
from ttmirror.cli import prove as cli_prove
from ttmirror.cli import review as cli_review
from ttmirror.cli import serving as cli_serving
from ttmirror.cli import soak as cli_soak
from ttmirror.cli import vllm as cli_vllm
from ttmirror.cli.arguments import (
    DEFAULTS,
    Parser,
    UsageError,
    add_bounds,
    bounds_from,
    emit,
    mkdir,
    writable,
)
from ttmirror.model.explore import Exploration
from ttmirror.model.state import Bounds
from ttmirror.report import check as report
from ttmirror.report.render import FORMATS, render
from ttmirror.report.views import counterexample_view, project

PLUGINS = (cli_conformance, cli_serving, cli_soak, cli_review, cli_vllm, cli_prove)
"""Modules adding subcommands, each with ``register(subparsers)``: their heavy imports (torch,
ttnn) happen inside their commands, so importing them here costs nothing."""


class _Progress:
    """A one-line progress display on stderr, shown only for runs longer than a second."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False
        self.tty = sys.stderr.isatty()

    def __call__(self, states: int, transitions: int, frontier: int) -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < 1.0 or not self.tty or (frontier and now - self.last < 0.2):
            return
        self.shown, self.last = True, now
        sys.stderr.write(
            f"\rexploring: {states:>9,} states {transitions:>10,} transitions "
            f"frontier {frontier:>7,}  {elapsed:5.1f} s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


_ENDS_PROCESS = False
"""Set by `run`: the process ends when `main` returns."""
_KEPT: list[Exploration] = []
"""Then, explorations kept to the end: freeing a million states object by object takes seconds
that the OS spends on nothing at exit."""


def _explore(b: Bounds, jobs: int | None = None) -> Exploration:
    """Explore ``b`` with ``jobs`` processes (default one per core), showing progress."""
    jobs = explore_jobs.default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, got {jobs}")
    progress = _Progress()
    if _ENDS_PROCESS:
        # The states live to the end of the process: kept out of the cycle collector's sight,
        # or its next full pass walks all of them (seconds at a million states), frees nothing.
        gc.disable()
    try:
        ex = explore_jobs.explore(b, jobs, progress=progress)
    finally:
        progress.close()
    if _ENDS_PROCESS:
        _KEPT.append(ex)
        gc.freeze()
        gc.enable()
    return ex


def cmd_check(ns: argparse.Namespace) -> int:
    ex = _explore(bounds_from(ns), ns.jobs)
    if ns.json:
        print(json.dumps(report.as_json(ex), indent=1))
    else:
        print(report.as_text(ex))
    return 0 if report.passed(ex) else 1


def cmd_graph(ns: argparse.Namespace) -> int:
    bounds = bounds_from(ns)
    # Checked before exploring: a typo must not cost the whole graph's exploration first.
    if ns.view == "slot" and not 0 <= ns.slot < bounds.slots:
        raise UsageError(f"--slot {ns.slot}: the bounds have {bounds.slots} slots "
                         f"(0 to {bounds.slots - 1}; raise --slots for more)")
    if ns.view == "request" and not 0 <= ns.request < bounds.requests:
        raise UsageError(f"--request {ns.request}: the bounds have {bounds.requests} requests "
                         f"(0 to {bounds.requests - 1}; raise --requests for more)")
    writable(ns.output)
    ex = _explore(bounds, ns.jobs)
    try:
        if ns.view == "counterexample":
            view = counterexample_view(ex)
        else:
            view = project(ex, ns.view, ns.slot if ns.view == "slot" else ns.request)
        text = render(view, ns.format)
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    emit(text, ns.output)
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    out = Path(ns.out)
    mkdir(out)
    print("== ttmirror check at the default bounds (state rows, vLLM's freedoms, every feature)")
    ex = _explore(DEFAULTS)
    print(report.as_text(ex))
    ok = report.passed(ex)
    written = []
    for fmt, ext in (("mermaid", "mmd"), ("svg", "svg")):
        path = out / f"slot-lifecycle.{ext}"
        emit(render(project(ex, "slot", 0), fmt), str(path))
        written.append(path)
    print("\n== the guard-off variant (--no-guard) must fail")
    bad = _explore(DEFAULTS._replace(guard=False))
    cex = report.counterexample(bad)
    if cex is None:
        print("FAIL: the guard-off variant passed: the checker cannot see the bug")
        ok = False
    else:
        print(f"guard off: {cex[0]} violated, shortest counterexample {len(cex[1])} steps")
        for fmt, ext in (("mermaid", "mmd"), ("svg", "svg")):
            path = out / f"guard-off-counterexample.{ext}"
            emit(render(counterexample_view(bad), fmt), str(path))
            written.append(path)
            path = out / f"guard-off-request0.{ext}"
            emit(render(project(bad, "request", 0), fmt), str(path))
            written.append(path)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0 if ok else 1


def cmd_tlc(ns: argparse.Namespace) -> int:
    from ttmirror import tlc

    bounds = bounds_from(ns)
    ex = _explore(bounds)
    try:
        result = tlc.cross_check(bounds, ex, graph=not ns.no_graph)
    except (tlc.TlcError, OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(result, indent=1))
        return 0 if result["agree"] else 1
    v = result["verdicts"]
    print(f"python explorer: {result['python_states']:,} states in {result['python_seconds']} s "
          f"({result['python_states_per_second']:,} states/s)")
    print(f"TLC:             {result['tlc_states']:,} states in {result['tlc_seconds']} s "
          f"({result['tlc_states_per_second']:,} states/s, whole process)")
    print(f"verdicts: python {v['python']['violated'] or 'all hold'}"
          f" ({v['python']['length']}), TLC {v['tlc']['violated'] or 'all hold'}"
          f" ({v['tlc']['length']}): {'agree' if v['agree'] else 'DISAGREE'}")
    g = result["graph"]
    if g is not None:
        same = g["same_nodes"] and g["same_edges"]
        print(f"state graph: {g['python_edges']:,} python edges, {g['tlc_edges']:,} TLC edges, "
              f"nodes {'equal' if g['same_nodes'] else 'DIFFER'}, "
              f"edges {'equal' if g['same_edges'] else 'DIFFER'}")
        if not same:
            print("  only in python: " + "; ".join(g["only_python"]))
            print("  only in TLC:    " + "; ".join(g["only_tlc"]))
    off = result["guard_off"]
    if off is not None and off["python_violated"] is None and off["tlc_violated"] is None:
        print("guard off: both hold (no row reads the mirror at these bounds): agree")
    elif off is not None:
        print(f"guard off: python {off['python_violated']} in {off['python_length']} steps, "
              f"TLC {off['tlc_violated']} in {off['tlc_length']} steps: "
              f"{'agree' if off['agree'] else 'DISAGREE'}")
    print("AGREE" if result["agree"] else "DISAGREE")
    return 0 if result["agree"] else 1


def cmd_info(ns: argparse.Namespace) -> int:
    from ttmirror.cli.info import backend_info  # imports ttnn and torch: only when asked

    try:
        info = backend_info(ns.backend, ns.async_scheduling, ns.spec_tokens)
    except ValueError as e:  # unknown backend, or async "on" where it cannot be
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(info, indent=1, default=str))
    else:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0


def add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=None,
                   help="processes exploring (default: one per core, "
                   f"{explore_jobs.default_jobs()}); the result is the same for any number")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ttmirror", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    c = sub.add_parser("check", help="explore every interleaving and check every property")
    add_bounds(c)
    c.add_argument("--json", action="store_true", help="print one JSON object")
    add_jobs(c)
    c.set_defaults(func=cmd_check)

    g = sub.add_parser("graph", help="draw a state graph (full, or one slot's / request's view)")
    add_bounds(g)
    add_jobs(g)
    g.add_argument("--view", choices=("full", "slot", "request", "counterexample"),
                   default="slot", help="which projection (default %(default)s)")
    g.add_argument("--slot", type=int, default=0, help="slot for --view slot")
    g.add_argument("--request", type=int, default=0, help="request for --view request")
    g.add_argument("--format", choices=FORMATS, default="mermaid",
                   help="output format (default %(default)s)")
    g.add_argument("-o", "--output", help="file to write (default stdout)")
    g.set_defaults(func=cmd_graph)

    d = sub.add_parser("demo", help="the main job: check at default bounds, write graphs")
    d.add_argument("--out", default="out", help="directory for the graphs (default %(default)s)")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("tlc", help="run TLC on the TLA+ twin and cross-check the explorer")
    add_bounds(t)
    t.add_argument("--no-graph", action="store_true",
                   help="compare state counts and verdicts only, not the whole graph")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=cmd_tlc)

    i = sub.add_parser("info", help="describe a backend: device, capability, async resolution")
    i.add_argument("--backend", default="tt", help="backend name (default %(default)s)")
    i.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto",
                   help="requested async scheduling (default %(default)s)")
    i.add_argument("--spec-tokens", type=int, default=0,
                   help="a speculative config of K drafts per decoding row: async scheduling "
                        "then needs a draft-aware combine (default %(default)s: none)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_info)
    for plugin in PLUGINS:
        plugin.register(sub.add_parser)
    return p


def main(argv: list[str] | None = None) -> int:
    # ttnn logs its whole config at DEBUG on import; users want our output, not that.
    os.environ.setdefault("LOGURU_LEVEL", "WARNING")
    try:
        ns = build_parser().parse_args(argv)
        return int(ns.func(ns))
    except UsageError as e:
        print(f"ttmirror: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ttmirror: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (a `| head`) went away: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def run() -> NoReturn:
    """The console entry point: `main`, then the process ends without freeing what an
    exploration built (its output is flushed first; nothing else is left to clean up)."""
    global _ENDS_PROCESS
    _ENDS_PROCESS = True
    code = main()
    if _KEPT:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()

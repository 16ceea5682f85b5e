"""The prove subcommand: the inductive invariant's obligations, discharged by an SMT solver.

    ttmirror prove [--depth D] [--spec-tokens K] [--preempt-policy P] [--faults] [--no-guard]
                   [--release-at R] [--variant V] [--slots K] [--solver z3|cvc5] [--rlimit N]
                   [--jobs N] [--manifest] [--json]

What the proof leaves unbounded (the number of requests, slots K >= D, rows per step, tokens per
request, preemptions, prompt chunks, host-sync requests, steps) and what it fixes (the depth D,
the spec tokens, the feature switches) is printed first. Exit codes: 0 every obligation holds,
1 one fails (its counterexample to induction is printed and looked up in the explorer) or is
neither proved nor refuted, 2 bad arguments (one line).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ttmirror.cli.arguments import DEFAULTS, AddParser, UsageError

UNBOUNDED = ("requests N >= 1", "slots K >= D", "rows per step", "max tokens per request",
             "preemptions per request", "prompt chunks per request", "host-sync requests (any "
             "set)", "steps")
"""What every proof leaves unbounded, in the words of its output."""


def register(add_parser: AddParser) -> None:
    """Add `prove` to the `ttmirror` parser."""
    p = add_parser(
        "prove",
        help="prove the guard for every size: the inductive invariant's obligations, by an SMT "
             "solver",
        description="Checks, with an SMT solver, that an inductive invariant (the model's safety "
        "invariants plus strengthening conjuncts) holds initially, is preserved by every action "
        "and implies each safety invariant, for every number of requests, slots, rows, tokens, "
        "preemptions and steps. The depth, the spec tokens and the feature switches are fixed "
        "per run. A failing obligation prints its counterexample to induction and whether the "
        "explorer reaches it.",
    )
    p.add_argument("--depth", type=int, default=2,
                   help="max_concurrent_batches D: 1 to 4 (default %(default)s)")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="K spec tokens per decoding row (default %(default)s)")
    p.add_argument("--slots", type=int, default=None,
                   help="only to ask for the known-bad ring of D - 1 slots; otherwise the proof "
                        "covers every K >= D")
    flag = argparse.BooleanOptionalAction
    p.add_argument("--finish", action=flag, default=True, help="stop tokens")
    p.add_argument("--abort", action=flag, default=True, help="user aborts")
    p.add_argument("--preempt", action=flag, default=True, help="preemption")
    p.add_argument("--condense", action=flag, default=True, help="rows may be reordered")
    p.add_argument("--state", choices=("ring", "rows"), default=DEFAULTS.state,
                   help="where in-flight tokens live on the device: the ring, or a state row per "
                        "request (spec rule 14) (default %(default)s)")
    p.add_argument("--subsets", action=flag, default=DEFAULTS.subsets,
                   help="vLLM's scheduler freedoms: any subset of the eligible requests per step, "
                        "any number of a row's drafts (spec rule 14) (default on)")
    p.add_argument("--guard", action=flag, default=True,
                   help="the stale-host-ids guard (--no-guard: the known-bad variant)")
    p.add_argument("--release-at", choices=("complete", "issue"), default="complete")
    p.add_argument("--preempt-policy", choices=("keep", "drop"), default="keep")
    p.add_argument("--faults", action=flag, default=None,
                   help="device faults (default off; on with --variant fault-spares-later-rows)")
    p.add_argument("--variant", default="", help="a known-bad variant of the model")
    p.add_argument("--solver", choices=("z3", "cvc5"), default="z3",
                   help="the SMT solver (default %(default)s)")
    p.add_argument("--rlimit", type=int, default=None,
                   help="the solver's resource units per query before it counts as unknown: a "
                        "bound on work, not time (default: RLIMIT, or CVC5_RLIMIT with cvc5, of "
                        "ttmirror.proof.obligations)")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes discharging obligations side by side (default one per "
                        "core)")
    p.add_argument("--manifest", action="store_true",
                   help="every option set the manifest lists as passing, one after another")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_prove)


def options_from(ns: argparse.Namespace) -> Any:
    """The option set the arguments select (UsageError, one line, if the model cannot mean
    it)."""
    from ttmirror.model.state import VARIANTS
    from ttmirror.proof.relation import Options

    if not 1 <= ns.depth <= 4:
        raise UsageError(f"--depth must be between 1 and 4, got {ns.depth}")
    if not 0 <= ns.spec_tokens <= 4:
        raise UsageError(f"--spec-tokens must be between 0 and 4, got {ns.spec_tokens}")
    if ns.variant and ns.variant not in VARIANTS:
        raise UsageError(f"--variant {ns.variant!r} is unknown; choose one of: "
                         f"{', '.join(VARIANTS)}")
    below = False
    if ns.slots is not None:
        if ns.slots == ns.depth - 1 and ns.slots >= 1:
            below = True
        elif ns.slots < ns.depth:
            raise UsageError(f"--slots {ns.slots}: the proof takes a ring of D - 1 = "
                             f"{ns.depth - 1} slots (known-bad) or covers every K >= D")
    faults = ns.faults if ns.faults is not None else ns.variant == "fault-spares-later-rows"
    return Options(depth=ns.depth, spec_tokens=ns.spec_tokens, finish=ns.finish,
                   abort=ns.abort, preempt=ns.preempt, condense=ns.condense, guard=ns.guard,
                   release_at=ns.release_at, preempt_policy=ns.preempt_policy, faults=faults,
                   variant=ns.variant, slots_below_depth=below, subsets=ns.subsets,
                   state=ns.state)


def manifest_option_sets() -> list[Any]:
    """The option sets of the manifest's passing entries, each once, in manifest order."""
    from ttmirror.manifest import load
    from ttmirror.proof.relation import Options

    out: list[Any] = []
    for e in load():
        if e.violated is None and (o := Options.of(e.bounds)) not in out:
            out.append(o)
    return out


def describe(opts: Any) -> str:
    """The option set in one line."""
    parts = [f"depth {opts.depth}", f"spec tokens {opts.spec_tokens}",
             f"preempt {opts.preempt_policy}", f"guard {'on' if opts.guard else 'off'}",
             f"release at {opts.release_at}", f"faults {'on' if opts.faults else 'off'}"]
    off = [n for n in ("finish", "abort", "preempt", "condense") if not getattr(opts, n)]
    if off:
        parts.append("no " + ", no ".join(off))
    if opts.variant:
        parts.append(f"variant {opts.variant}")
    if opts.slots_below_depth:
        parts.append(f"ring of {opts.depth - 1} slot(s)")
    if opts.state != "ring":
        parts.append(f"state {opts.state}")
    if opts.subsets:
        parts.append("subsets")
    return ", ".join(parts)


def run_set(opts: Any, solver: str, rlimit: int, say: Any, jobs: int = 1) -> dict[str, Any]:
    """Every obligation of one option set; ``say`` gets each line as it is decided."""
    from ttmirror.proof.lookup import Explorer
    from ttmirror.proof.obligations import Setup, obligations
    from ttmirror.proof.symbolic import Smt
    from ttmirror.report.check import plain
    from ttmirror.report.views import summarize

    explorer = Explorer()
    setup = Setup(Smt(solver), opts, rlimit=rlimit,
                  accept=explorer.accepts, tries=3)
    fixed = f"D = {opts.depth} queue places, {opts.spec_tokens} draft place(s) per row"
    unbounded = [*UNBOUNDED, *(["state rows S >= 1"] if opts.rows else [])]
    say(f"ttmirror prove: {describe(opts)} ({solver})")
    say(f"  fixed: {fixed}; unbounded: {', '.join(unbounded)}")
    results = []
    start = time.perf_counter()
    for r in obligations(setup, jobs):
        say("  " + r.line())
        entry: dict[str, Any] = {"kind": r.kind, "name": r.name, "verdict": r.verdict,
                                 "seconds": round(r.seconds, 3)}
        if r.cti is not None:
            found = explorer.lookup(r.cti)
            entry["counterexample"] = {
                "action": r.cti.action, "breaks": r.cti.broken,
                "before": plain(r.cti.before), "after": plain(r.cti.after),
                "bounds": plain(r.cti.bounds), "reachable": found.reachable,
                "path": found.path, "explored_states": found.states,
            }
            say(f"    counterexample to induction: {r.cti.action} breaks "
                f"{', '.join(r.cti.broken)}")
            say(f"      before: {summarize(r.cti.before)}")
            say(f"      after:  {summarize(r.cti.after)}")
            if found.reachable:
                say(f"      reachable (a real bug): {len(found.path)} steps from the initial "
                    f"state: {' '.join(found.path)}")
            else:
                why = found.why or f"not among the {found.states:,} states the explorer reaches"
                say(f"      not reachable at its bound ({why}): a state only the invariant admits")
        results.append(entry)
    seconds = time.perf_counter() - start
    holds = all(e["verdict"] == "holds" for e in results)
    out: dict[str, Any] = {}
    if not holds and (known := known_bad(opts)) is not None:
        out["explorer_crossing"] = crossing_of(setup, known, say)
    return {**out, "options": asdict(opts),
            "solver": solver, "fixed": fixed, "unbounded": unbounded,
            "obligations": results, "holds": holds, "seconds": round(seconds, 2)}


def known_bad(opts: Any) -> Any:
    """The smallest manifest entry of this option set that the explorer finds failing."""
    from ttmirror.manifest import SIZES, load
    from ttmirror.proof.relation import Options

    bad = [e for e in load() if e.violated and Options.of(e.bounds) == opts]
    return min(bad, key=lambda e: SIZES.index(e.size), default=None)


def crossing_of(setup: Any, entry: Any, say: Any) -> dict[str, Any]:
    """Where the explorer's shortest counterexample at a known-bad entry leaves the invariant:
    a counterexample to induction reachable by construction, confirmed by the solver."""
    from ttmirror.proof.lookup import crossing
    from ttmirror.report.check import plain
    from ttmirror.report.views import summarize

    found = crossing(setup, entry.bounds)
    if found is None:
        say(f"  the explorer's counterexample at {entry.name} never leaves the invariant")
        return {"entry": entry.name, "found": False}
    cti, path = found
    say(f"  the explorer's shortest counterexample ({entry.name}, {entry.violated}) leaves the "
        f"invariant after {len(path)} steps: {cti.action} breaks {', '.join(cti.broken)} "
        "(the solver confirms this counterexample to induction)")
    say(f"    path:   {' '.join(path) or '(the initial state)'}")
    say(f"    before: {summarize(cti.before)}")
    say(f"    after:  {summarize(cti.after)}")
    return {"entry": entry.name, "found": True, "action": cti.action, "breaks": cti.broken,
            "path": path, "before": plain(cti.before), "after": plain(cti.after)}


def cmd_prove(ns: argparse.Namespace) -> int:
    sets = manifest_option_sets() if ns.manifest else [options_from(ns)]
    from ttmirror.explore_jobs import default_jobs
    from ttmirror.proof.obligations import CVC5_RLIMIT, RLIMIT

    default = RLIMIT if ns.solver == "z3" else CVC5_RLIMIT
    rlimit = default if ns.rlimit is None else ns.rlimit
    if rlimit <= 0:
        raise UsageError(f"--rlimit must be positive, got {rlimit}")
    jobs = default_jobs() if ns.jobs is None else ns.jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, got {jobs}")
    def say(line: str) -> None:
        if not ns.json:
            print(line, flush=True)

    start = time.perf_counter()
    runs = [run_set(o, ns.solver, rlimit, say, jobs) for o in sets]
    seconds = time.perf_counter() - start
    holds = all(r["holds"] for r in runs)
    count = sum(len(r["obligations"]) for r in runs)
    if ns.json:
        out = runs[0] if len(runs) == 1 else {"option_sets": runs}
        print(json.dumps({**out, "holds": holds, "seconds": round(seconds, 2)}, indent=1))
    elif holds:
        print(f"ttmirror prove: {count} obligations hold in {seconds:.1f} s: the invariant holds "
              "for every number of requests, tokens, preemptions and steps")
    else:
        bad = sum(e["verdict"] != "holds" for r in runs for e in r["obligations"])
        print(f"ttmirror prove: {bad} of {count} obligations do not hold ({seconds:.1f} s)")
    return 0 if holds else 1

"""The expected results of every model checked: `specs/manifest.json`, and the checks against it.

In the spirit of the TLA+ Examples repository's manifest: one entry per bound or variant, with
its size class, the distinct states and transitions, each property's verdict (``"ok"``, or the
length of its shortest counterexample) and the first failure. Who reads it:

- CI (`tests/test_manifest.py`): the explorer at every ``small`` and ``default`` entry, TLC at
  every ``small`` one;
- `make bench-check` (`benchmarks/bench_check.py`): TLC at the ``default`` entries, both checkers
  at the ``large`` ones (a million states and more);
- `python -m ttmirror.report.specdoc`: the README's and the spec's tables of results are
  generated from it, so no figure there is typed by hand.

After a deliberate change to the model, `python -m ttmirror.manifest --update [--size S]`
rewrites the entries from the explorer; review the diff like any other change of results.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model.explore import Exploration, explore
from .model.explore import verdicts as report_verdicts
from .model.state import Bounds
from .resources import MANIFEST as PATH

SIZES = ("small", "default", "large")
"""small: TLC in CI; default: the explorer in CI, TLC in bench-check; large: bench-check only."""

OPTIONS: dict[str, tuple[str, Any]] = {
    "depth": ("--depth", None), "slots": ("--slots", None), "requests": ("--requests", None),
    "max_tokens": ("--max-tokens", None), "preemptions": ("--preemptions", None),
    "finish": ("--no-finish", False), "abort": ("--no-abort", False),
    "preempt": ("--no-preempt", False), "condense": ("--no-condense", False),
    "guard": ("--no-guard", False), "release_at": ("--release-at", None),
    "preempt_policy": ("--preempt-policy", None), "prefill_chunks": ("--prefill-chunks", None),
    "host_sync": ("--host-sync", True), "faults": ("--faults", True),
    "spec_tokens": ("--spec-tokens", None),
    "variant": ("--variant", None), "state": ("--state", None),
    "state_rows": ("--state-rows", None), "subsets": ("--no-subsets", False),
}
"""Bounds field -> the `ttmirror check` option that sets it (and the value a bare flag means)."""


@dataclass(frozen=True)
class Entry:
    """One model checked: its bounds and what checking it must find."""

    name: str
    size: str
    about: str
    bounds: Bounds
    states: int
    transitions: int
    verdicts: dict[str, str | int]
    """Property -> "ok", or the length of its shortest counterexample."""
    violated: str | None
    """The failure `ttmirror check` reports (the shortest; invariants before graph properties)."""

    @property
    def length(self) -> int | None:
        """The reported failure's counterexample length."""
        value = self.verdicts.get(self.violated) if self.violated else None
        return value if isinstance(value, int) else None

    @property
    def flags(self) -> str:
        """The `ttmirror check` options of these bounds ("" at the defaults)."""
        return flags(self.bounds)


def flags(bounds: Bounds) -> str:
    """The command-line options that select ``bounds``."""
    out: list[str] = []
    changed = _changed(bounds)
    if bounds.spec_tokens and "max_tokens" not in changed:
        # With drafts `check` defaults to its own max tokens (arguments.SPEC_MAX_TOKENS).
        changed = {"max_tokens": bounds.max_tokens, **changed}
    for field, value in changed.items():
        option, bare = OPTIONS[field]
        out.append(option if bare is not None else f"{option} {value}")
    return " ".join(out)


def _changed(bounds: Bounds) -> dict[str, Any]:
    base = Bounds()
    return {f: getattr(bounds, f) for f in Bounds._fields
            if getattr(bounds, f) != getattr(base, f)}


def load(path: Path = PATH) -> list[Entry]:
    """Every entry of the manifest."""
    data = json.loads(path.read_text())
    return [
        Entry(name=e["name"], size=e["size"], about=e["about"], bounds=Bounds(**e["bounds"]),
              states=e["states"], transitions=e["transitions"], verdicts=e["verdicts"],
              violated=e["violated"])
        for e in data["models"]
    ]


def entry(name: str, path: Path = PATH) -> Entry:
    """The entry called ``name``."""
    for e in load(path):
        if e.name == name:
            return e
    raise KeyError(f"no manifest entry {name!r}")


def observe(ex: Exploration) -> dict[str, Any]:
    """What the explorer found, in the manifest's terms."""
    shortest = {"NoDeadlock": ex.deadlocks, "CanAlwaysFinish": ex.cannot_finish}
    verdicts: dict[str, str | int] = {}
    for name, verdict in report_verdicts(ex).items():
        if verdict == "ok":
            verdicts[name] = "ok"
        elif name in shortest:
            verdicts[name] = min(len(ex.path_to(n)) for n in shortest[name])
        else:
            verdicts[name] = len(ex.path_to(ex.violations[name]))
    failure = ex.failure()
    return {
        "states": len(ex.states),
        "transitions": ex.transitions,
        "verdicts": verdicts,
        "violated": failure[0] if failure else None,
    }


def python_differences(e: Entry, ex: Exploration) -> list[str]:
    """How the explorer's results at ``e.bounds`` differ from the entry; [] when they agree."""
    seen = observe(ex)
    expected = {"states": e.states, "transitions": e.transitions, "verdicts": e.verdicts,
                "violated": e.violated}
    return [f"{e.name}: {key}: manifest {expected[key]!r}, explorer {seen[key]!r}"
            for key in expected if expected[key] != seen[key]]


def tlc_differences(e: Entry, distinct_states: int, violated: str | None,
                    trace_len: int | None) -> list[str]:
    """How a TLC run at ``e.bounds`` differs from the entry; [] when they agree.

    TLC checks no EF property (`CanAlwaysFinish` is the explorer's alone). When nothing else
    fails, TLC must find the same distinct states and no violation. Otherwise it stops at its
    first violation, which may be another property broken at the same depth: it must be one
    the entry says is violated, with the entry's counterexample length.
    """
    failing = {k: v for k, v in e.verdicts.items() if v != "ok" and k != "CanAlwaysFinish"}
    if not failing:
        out = []
        if violated is not None:
            out.append(f"{e.name}: TLC found {violated} violated; the manifest says none is")
        if distinct_states != e.states:
            out.append(f"{e.name}: states: manifest {e.states:,}, TLC {distinct_states:,}")
        return out
    if violated is None:
        return [f"{e.name}: TLC found no violation; the manifest says {e.violated}"]
    if violated not in failing:
        return [f"{e.name}: TLC found {violated} violated; the manifest says it holds"]
    if trace_len != failing[violated]:
        return [f"{e.name}: {violated}: manifest {failing[violated]} steps, TLC {trace_len}"]
    return []


def updated(entries: list[Entry], sizes: set[str], progress: bool = True) -> list[dict[str, Any]]:
    """The manifest's entries, those of ``sizes`` re-observed by the explorer."""
    out = []
    for e in entries:
        record: dict[str, Any] = {"name": e.name, "size": e.size, "about": e.about,
                                  "bounds": _changed(e.bounds)}
        if e.size in sizes:
            if progress:
                print(f"manifest: exploring {e.name} ({e.flags or 'default bounds'})",
                      file=sys.stderr, flush=True)
            record.update(observe(explore(e.bounds)))
        else:
            record.update(states=e.states, transitions=e.transitions, verdicts=e.verdicts,
                          violated=e.violated)
        out.append(record)
    return out


def write(records: list[dict[str, Any]], path: Path = PATH) -> None:
    path.write_text(json.dumps({"models": records}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttmirror.manifest", description=__doc__.split(
        "\n")[0])
    p.add_argument("--size", action="append", choices=SIZES,
                   help="only entries of this size (repeatable; default small and default)")
    p.add_argument("--update", action="store_true",
                   help="rewrite those entries from the explorer instead of checking them")
    ns = p.parse_args(argv)
    sizes = set(ns.size or ("small", "default"))
    entries = load()
    if ns.update:
        write(updated(entries, sizes))
        print(f"updated {PATH}")
        return 0
    bad: list[str] = []
    for e in entries:
        if e.size in sizes:
            found = python_differences(e, explore(e.bounds))
            print(f"{'ok  ' if not found else 'DIFF'}  {e.name:<34} {e.states:>10,} states")
            bad += found
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

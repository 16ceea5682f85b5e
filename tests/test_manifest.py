"""The manifest (`specs/manifest.json`) holds: the explorer finds exactly its results at every
small and default bound, and TLC at every small one (`make bench-check` runs TLC at the default
bounds and both checkers at the large ones). The tables of README and spec come from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ttmirror import manifest, tlc
from ttmirror.model.explore import Exploration
from ttmirror.model.state import RING, Bounds

Explored = Callable[[Bounds], Exploration]
ENTRIES = manifest.load()
CI = [e for e in ENTRIES if e.size in ("small", "default")]
SMALL = [e for e in ENTRIES if e.size == "small"]


def test_the_manifest_is_well_formed() -> None:
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names))
    assert {e.size for e in ENTRIES} <= set(manifest.SIZES)
    assert len({e.bounds for e in ENTRIES}) == len(ENTRIES)  # no bound twice
    for e in ENTRIES:
        assert e.states > 0 and e.transitions > 0 and e.verdicts
        assert (e.violated is None) == all(v == "ok" for v in e.verdicts.values())
        assert e.violated is None or isinstance(e.length, int)
    # What the issue of depth asks for: K = D suffices at D = 3 and K = D - 1 does not.
    assert manifest.entry("depth-3").bounds == RING._replace(depth=3, slots=3)
    assert manifest.entry("depth-3").violated is None
    assert manifest.entry("depth-3-two-slots").violated == "NoRewriteWhileReaderOutstanding"


@pytest.mark.parametrize("entry", CI, ids=[e.name for e in CI])
def test_the_explorer_finds_what_the_manifest_says(entry: manifest.Entry,
                                                   explored: Explored) -> None:
    assert manifest.python_differences(entry, explored(entry.bounds)) == []


@pytest.mark.parametrize("entry", SMALL, ids=[e.name for e in SMALL])
def test_tlc_finds_what_the_manifest_says(entry: manifest.Entry, tmp_path: Path) -> None:
    run = tlc.run_tlc(entry.bounds, tmp_path)
    assert manifest.tlc_differences(entry, run.distinct_states, run.violated, run.trace_len) == []


def test_a_wrong_manifest_is_caught(explored: Explored) -> None:
    right = manifest.entry("small")
    ex = explored(right.bounds)
    wrong = right.__class__(**{**right.__dict__, "states": right.states + 1})
    assert manifest.python_differences(wrong, ex) == [
        f"small: states: manifest {right.states + 1!r}, explorer {right.states!r}"]
    assert manifest.tlc_differences(wrong, right.states, None, None) == [
        f"small: states: manifest {right.states + 1:,}, TLC {right.states:,}"]
    bad = manifest.entry("small-guard-off")
    assert manifest.tlc_differences(bad, 0, "StaleHostIdsGuard", bad.length) == []
    assert manifest.tlc_differences(bad, 0, "StaleHostIdsGuard", 99)
    assert manifest.tlc_differences(bad, 0, None, None)
    assert manifest.tlc_differences(bad, 0, "DepthBound", bad.length)


def test_flags_select_the_bounds() -> None:
    from ttmirror.cli import build_parser
    from ttmirror.cli.arguments import bounds_from

    for e in ENTRIES:
        ns = build_parser().parse_args(["check", *e.flags.split()])
        assert bounds_from(ns) == e.bounds, e.name

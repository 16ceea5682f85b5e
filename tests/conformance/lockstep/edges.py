"""Every edge of a bound walked in lockstep, and what the walks reached (shared by the tests of
rule 14's freedoms and state rows)."""

from __future__ import annotations

import math
from collections.abc import Callable

from ttmirror.conformance.campaigns import branches
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import SOMETIMES
from ttmirror.model.state import Bounds

Explored = Callable[[Bounds], Exploration]


def walk_every_edge(bounds: Bounds, backend: str, config: str | None,
                    explored: Explored) -> Coverage:
    """Walk every edge of `bounds` on `backend` in lockstep with the model: no divergence, every
    edge covered, none unreachable; returns the coverage."""
    ex = explored(bounds)
    assert ex.ok and all(ex.sometimes.values())
    cov = Coverage(ex)
    kwargs = {"config": config} if config else {}
    report = branches.run(cov, backend, seed=0, seconds=math.inf, **kwargs)
    assert report.failure is None and report.stopped == "covered", report.failure
    assert cov.edges_covered == 1.0 and report.unreachable == 0
    return cov


def reached(cov: Coverage, b: Bounds) -> set[str]:
    """The sometimes checks the covered edges reach (each edge's actions, as the model takes
    them from its source state to its target)."""
    from ttmirror.model.actions import successors

    out = set()
    for u, v in cov.edges:
        s, target = cov.ex.states[u], cov.ex.states[v]
        for a, t in successors(s, b):
            if t == target:
                out |= {c.name for c in SOMETIMES if c.applies(b) and c.reached(s, a, t, b)}
    return out

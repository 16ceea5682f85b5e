"""The lockstep with vLLM's scheduler freedoms on the ring (spec rule 14, depth 2): steps that
leave running requests out, rows that carry fewer drafts than they have, none beside all in one
step. Every edge of each bound is walked by the implementation in lockstep with the model, its
device data compared at every move, and the situations each freedom adds really occur."""

from __future__ import annotations

import pytest

from ttmirror.model.invariants import SOMETIMES
from ttmirror.model.state import RING, Bounds

from .edges import Explored, reached, walk_every_edge

QUIET = {"abort": False, "preempt": False, "finish": False}
SKIPS = RING._replace(subsets=True, **QUIET)
"""Two requests of two tokens, any subset per step."""
FEWER = RING._replace(subsets=True, spec_tokens=1, max_tokens=2, **QUIET)
"""Two requests, one draft: a row with none of its draft beside a row with it."""
ONE_OF_TWO = RING._replace(subsets=True, spec_tokens=2, max_tokens=3, requests=1)
"""One request of three tokens, any of two drafts per decoding row, with request events."""


@pytest.mark.parametrize(("bounds", "backend", "config"), [
    (SKIPS, "tt", "traced"), (SKIPS, "cpu", None), (FEWER, "cpu", None),
    (ONE_OF_TWO, "cpu", None)], ids=["skips-tt-traced", "skips-cpu", "fewer-cpu", "one-of-two-cpu"])
def test_every_edge_of_a_subsets_bound_conforms(bounds: Bounds, backend: str, config: str | None,
                                                explored: Explored) -> None:
    cov = walk_every_edge(bounds, backend, config, explored)
    # Each freedom's situation was walked by the implementation, not only by the model.
    new = {"skipped_with_step_in_flight", "fewer_drafts", "no_drafts_beside_all"}
    wanted = {c.name for c in SOMETIMES if c.name in new and c.applies(bounds)}
    assert wanted and wanted <= reached(cov, bounds)

"""The lockstep with per-request state rows on the device (spec rule 14): every edge of each
bound walked by the implementation in lockstep with the model, the table's newest tokens and
positions compared as device data at every move (a state row a step does not name must keep
what it held), on the cpu and on the emulated device eager with one or two queues and traced;
and the situations state rows add (a request absent from the step after its own, a state row
reused, a closed owner's row written by its dropped row) really occur in the walks."""

from __future__ import annotations

import pytest

from ttmirror.model.invariants import SOMETIMES
from ttmirror.model.state import RING, Bounds

from .edges import Explored, reached, walk_every_edge

QUIET = {"abort": False, "preempt": False, "finish": False}
ONE = RING._replace(requests=1, state="rows")
"""One request, every request event, state rows."""
SKIPS = RING._replace(state="rows", subsets=True, **QUIET)
"""Two requests of two tokens, any subset per step."""
REUSE = RING._replace(state="rows", state_rows=1, subsets=True, abort=False, preempt=False)
"""Two requests, one state row: the second waits for the first one's row and reuses it (a stop
token closes the first with its next step in flight, whose dropped row still writes the row)."""
DEPTH_3 = RING._replace(depth=3, slots=3, state="rows", subsets=True, condense=False, **QUIET)
"""Pipeline batches: three steps in flight, a request absent from the step after its own."""
DEPTH_4 = RING._replace(depth=4, slots=4, requests=1, max_tokens=3, state="rows", subsets=True)
ONE_DRAFT = RING._replace(requests=1, max_tokens=3, spec_tokens=1, state="rows", subsets=True)
"""Drafts in the state rows: the position and the drafts after the newest token. (A row with
none of its drafts beside one with all, on state rows: `tests/impl/test_runner_state_rows.py`,
device data against the reference and every run validated; the ring's lockstep walks it.)"""

CASES = [(ONE, "tt", "eager-2cq"), (ONE, "tt", "eager-1cq"), (ONE, "tt", "traced"),
         (SKIPS, "cpu", None), (REUSE, "cpu", None), (DEPTH_3, "cpu", None),
         (DEPTH_4, "tt", "eager-1cq"), (ONE_DRAFT, "tt", "eager-2cq")]
IDS = ["one-tt-eager-2cq", "one-tt-eager-1cq", "one-tt-traced", "skips-cpu", "reuse-cpu",
       "depth3-cpu", "depth4-tt-eager-1cq", "one-draft-tt-eager-2cq"]
ROWS_CHECKS = {"absent_after_own", "state_row_reused", "closed_owner_row_written",
               "skipped_with_step_in_flight"}


@pytest.mark.parametrize(("bounds", "backend", "config"), CASES, ids=IDS)
def test_every_edge_of_a_state_rows_bound_conforms(bounds: Bounds, backend: str,
                                                   config: str | None,
                                                   explored: Explored) -> None:
    cov = walk_every_edge(bounds, backend, config, explored)
    assert "release_row" in cov.actions  # counted among the actions a run drives
    if bounds == ONE:  # every request event: every action
        assert cov.actions_covered == 1.0
    # What state rows add was walked by the implementation, not only by the model.
    wanted = {c.name for c in SOMETIMES if c.name in ROWS_CHECKS and c.applies(bounds)}
    assert wanted <= reached(cov, bounds)


def test_the_walks_reach_every_situation_state_rows_add(explored: Explored) -> None:
    """Across the bounds above, each of rule 14's sometimes checks applies somewhere."""
    applies = {c.name for b, _, _ in CASES for c in SOMETIMES
               if c.name in ROWS_CHECKS and c.applies(b)}
    assert applies == ROWS_CHECKS

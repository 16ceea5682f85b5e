"""The exhaustive check: the design holds at default bounds, known-bad variants fail minimally."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ttmirror import manifest
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import INVARIANTS, SOMETIMES
from ttmirror.model.state import RING, Bounds
from ttmirror.report import check as report

Explored = Callable[[Bounds], Exploration]

OPTION_ONLY = {"partial_prefill_beside_mirror", "host_sync_skipped", "fault_spares_bystander",
               "fault_after_launch", "mirror_read_three_in_flight", "accepted_0", "accepted_1",
               "accepted_2", "accepted_counts_differ", "reentry_beside_device_drafts",
               "preempt_with_drafts_in_flight", "skipped_with_step_in_flight", "fewer_drafts",
               "no_drafts_beside_all", "absent_after_own", "state_row_reused",
               "closed_owner_row_written"}
"""Sometimes checks of options that are off at the default bounds (chunking, host sync,
faults, depth 3, spec decoding, subsets, state rows)."""


def test_default_bounds_hold_and_every_situation_occurs(default_run: Exploration) -> None:
    ex = default_run
    assert ex.violations == {}
    assert ex.deadlocks == [] and ex.cannot_finish == []
    # Every check applies at the default bounds but those of the options that are off there.
    assert set(ex.sometimes) == {c.name for c in SOMETIMES} - OPTION_ONLY
    assert all(ex.sometimes.values()), report.unreached(ex)
    assert len(ex.finals) > 0
    assert len(ex.states) > 10_000  # the bounds really exercise the pipeline
    assert report.passed(ex)


def test_default_bounds_reach_both_steps_in_flight(default_run: Exploration) -> None:
    ex = default_run
    assert max(len(s.queue) for s in ex.states) == 2


def test_depth_1_is_the_oracle_and_passes(explored: Explored) -> None:
    ex = explored(RING._replace(depth=1))
    assert ex.ok
    assert all(len(s.queue) <= 1 for s in ex.states)
    assert "combined_from_mirror" not in ex.sometimes  # n/a: sync never mirrors
    assert report.passed(ex)


KNOWN_BAD = [e for e in manifest.load() if e.size == "default" and e.violated is not None]


@pytest.mark.parametrize("entry", KNOWN_BAD, ids=[e.name for e in KNOWN_BAD])
def test_known_bad_variants_fail_with_minimal_counterexample(
    entry: manifest.Entry, explored: Explored
) -> None:
    variant, invariant = entry.bounds, entry.violated
    assert invariant is not None
    ex = explored(variant)
    cex = report.counterexample(ex)
    assert cex is not None
    name, steps = cex
    assert name == invariant
    assert len(steps) == entry.length  # the manifest's figure, and a shortest path (BFS)
    assert not report.passed(ex)
    # The last step is where the rule breaks; the state before it is still clean.
    path = ex.path_to(ex.violations[invariant])
    before = ex.states[path[-2][1]]
    inv = next(i for i in INVARIANTS if i.name == invariant)
    assert inv.holds(before, variant) and not inv.holds(ex.states[path[-1][1]], variant)


@pytest.mark.parametrize(
    ("option", "checks"),
    [
        (RING._replace(preempt_policy="drop"), set()),
        (RING._replace(prefill_chunks=2), {"partial_prefill_beside_mirror"}),
        (RING._replace(host_sync=True), {"host_sync_skipped"}),
        (RING._replace(faults=True), {"fault_spares_bystander", "fault_after_launch"}),
        (RING._replace(depth=3, slots=3), {"mirror_read_three_in_flight"}),
    ],
    ids=["preempt-drop", "prefill-chunks-2", "host-sync", "faults", "depth-3"],
)
def test_each_option_holds_at_the_default_bounds_and_its_situations_occur(
    option: Bounds, checks: set[str], explored: Explored
) -> None:
    ex = explored(option)
    assert ex.ok and report.passed(ex), report.unreached(ex)
    assert checks <= set(ex.sometimes) and all(ex.sometimes.values())
    keep_only = {"preempted_token_delivered", "resume_waited_for_placeholder"}
    assert (keep_only <= set(ex.sometimes)) == (option.preempt_policy == "keep")


def test_one_slot_is_safe_when_only_one_step_is_in_flight(explored: Explored) -> None:
    assert explored(RING._replace(slots=1, depth=1)).ok


def test_counterexamples_are_shortest_paths(explored: Explored) -> None:
    import networkx as nx

    ex = explored(RING._replace(guard=False))
    target = ex.violations["StaleHostIdsGuard"]
    assert len(ex.path_to(target)) == nx.shortest_path_length(ex.graph, 0, target)


def test_graph_edges_are_labelled_with_actions(default_run: Exploration) -> None:
    ex = default_run
    assert ex.graph.number_of_nodes() == len(ex.states)
    labels = {d["action"].split("(")[0] for _, _, d in ex.graph.edges(data=True)}
    assert {"allocate", "arrive", "schedule", "combine", "launch", "readback_issue",
            "readback_complete", "apply", "release", "finish", "abort", "preempt",
            "resume"} <= {label.split(" | ")[0] for label in labels}

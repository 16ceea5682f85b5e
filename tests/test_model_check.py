"""The exhaustive check: the design holds at default bounds, known-bad variants fail minimally."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ttmirror import report
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import INVARIANTS, SOMETIMES
from ttmirror.model.state import Bounds

Explored = Callable[[Bounds], Exploration]

OPTION_ONLY = {"partial_prefill_beside_mirror", "host_sync_skipped", "fault_spares_bystander",
               "fault_after_launch"}
"""Sometimes checks of options that are off at the default bounds (chunking, host sync,
faults)."""


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
    ex = explored(Bounds(depth=1))
    assert ex.ok
    assert all(len(s.queue) <= 1 for s in ex.states)
    assert "combined_from_mirror" not in ex.sometimes  # n/a: sync never mirrors
    assert report.passed(ex)


@pytest.mark.parametrize(
    ("variant", "invariant", "length"),
    [
        (Bounds(guard=False), "StaleHostIdsGuard", 7),
        (Bounds(slots=1), "NoRewriteWhileReaderOutstanding", 8),
        (Bounds(release_at="issue"), "NoReadOfReleasedOrOverwrittenSlot", 8),
        (Bounds(variant="resume-with-placeholder"), "StaleHostIdsGuard", 9),
        (Bounds(prefill_chunks=2, variant="partial-prefill-feeds-mirror"), "StaleHostIdsGuard", 7),
        (Bounds(host_sync=True, variant="host-sync-unguarded"), "StaleHostIdsGuard", 7),
        (Bounds(faults=True, variant="fault-spares-later-rows"), "FailedRequestsQuiet", 5),
    ],
    ids=["guard-off", "one-slot", "release-at-issue", "resume-with-placeholder",
         "partial-prefill-feeds-mirror", "host-sync-unguarded", "fault-spares-later-rows"],
)
def test_known_bad_variants_fail_with_minimal_counterexample(
    variant: Bounds, invariant: str, length: int, explored: Explored
) -> None:
    ex = explored(variant)
    cex = report.counterexample(ex)
    assert cex is not None
    name, steps = cex
    assert name == invariant
    assert len(steps) == length
    assert not report.passed(ex)
    # The last step is where the rule breaks; the state before it is still clean.
    path = ex.path_to(ex.violations[invariant])
    before = ex.states[path[-2][1]]
    inv = next(i for i in INVARIANTS if i.name == invariant)
    assert inv.holds(before, variant) and not inv.holds(ex.states[path[-1][1]], variant)


@pytest.mark.parametrize(
    ("option", "checks"),
    [
        (Bounds(preempt_policy="drop"), set()),
        (Bounds(prefill_chunks=2), {"partial_prefill_beside_mirror"}),
        (Bounds(host_sync=True), {"host_sync_skipped"}),
        (Bounds(faults=True), {"fault_spares_bystander", "fault_after_launch"}),
    ],
    ids=["preempt-drop", "prefill-chunks-2", "host-sync", "faults"],
)
def test_each_option_holds_at_the_default_bounds_and_its_situations_occur(
    option: Bounds, checks: set[str], explored: Explored
) -> None:
    ex = explored(option)
    assert ex.ok and report.passed(ex), report.unreached(ex)
    assert checks <= set(ex.sometimes) and all(ex.sometimes.values())
    keep_only = {"preempted_token_delivered", "resume_waited_for_placeholder"}
    assert (keep_only <= set(ex.sometimes)) == (option.preempt_policy == "keep")


COUNTS = {
    Bounds(): (40_667, 137_869),
    Bounds(preempt_policy="drop"): (141_033, 534_610),
    Bounds(prefill_chunks=2): (136_661, 525_320),
    Bounds(host_sync=True): (28_377, 96_531),
    Bounds(depth=1): (10_413, 32_887),
    Bounds(faults=True): (65_350, 266_096),
}
"""States and transitions per bound: the spec's "Bounds and results" table quotes these."""


@pytest.mark.parametrize("bounds", list(COUNTS), ids=["default", "preempt-drop",
                                                      "prefill-chunks-2", "host-sync", "depth-1",
                                                      "faults"])
def test_state_counts_are_pinned(bounds: Bounds, explored: Explored) -> None:
    ex = explored(bounds)
    assert (len(ex.states), ex.transitions) == COUNTS[bounds]


def test_the_spec_quotes_the_pinned_counts() -> None:
    from ttmirror.specdoc import SPEC

    text = SPEC.read_text()
    for states, transitions in COUNTS.values():
        assert f"| {states:,} | {transitions:,} |" in text


def test_one_slot_is_safe_when_only_one_step_is_in_flight(explored: Explored) -> None:
    assert explored(Bounds(slots=1, depth=1)).ok


def test_counterexamples_are_shortest_paths(explored: Explored) -> None:
    import networkx as nx

    ex = explored(Bounds(guard=False))
    target = ex.violations["StaleHostIdsGuard"]
    assert len(ex.path_to(target)) == nx.shortest_path_length(ex.graph, 0, target)


def test_graph_edges_are_labelled_with_actions(default_run: Exploration) -> None:
    ex = default_run
    assert ex.graph.number_of_nodes() == len(ex.states)
    labels = {d["action"].split("(")[0] for _, _, d in ex.graph.edges(data=True)}
    assert {"allocate", "arrive", "schedule", "combine", "launch", "readback_issue",
            "readback_complete", "apply", "release", "finish", "abort", "preempt",
            "resume"} <= {label.split(" | ")[0] for label in labels}

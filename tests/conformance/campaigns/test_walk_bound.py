"""The walk lower bound (`conformance/walk_bound.py`) is the fewest walks from the initial state
that cover every edge: checked against a brute-force search over every set of maximal paths, on
a tiny bound of the model and on random small DAGs; and graphs with a cycle are refused by name."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttmirror.conformance.campaigns.coverage import Coverage, Planner
from ttmirror.conformance.campaigns.walk_bound import CycleError, walks_lower_bound
from ttmirror.model.explore import Edges, Exploration, explore
from ttmirror.model.state import RING, initial_state


def maximal_path_masks(graph: nx.DiGraph) -> list[int]:
    """Each path from state 0 to a state with no way out, as a bit mask of its edges (any walk
    from 0 can be prolonged to one of these, so they suffice for a cover)."""
    index = {e: i for i, e in enumerate(graph.edges())}
    ends = [n for n in graph if graph.out_degree(n) == 0 and n != 0]
    return sorted({sum(1 << index[u, v] for u, v in itertools.pairwise(p))
                   for end in ends for p in nx.all_simple_paths(graph, 0, end)})


def brute_force_walks(graph: nx.DiGraph) -> int:
    """The fewest maximal paths whose edges are all of them: exhaustive branch and bound, each
    branch covering the lowest uncovered edge by one of the paths through it."""
    masks = maximal_path_masks(graph)
    full = (1 << graph.number_of_edges()) - 1
    best = len(masks)

    def cover(covered: int, used: int) -> None:
        nonlocal best
        if covered == full:
            best = min(best, used)
            return
        if used + 1 >= best:
            return
        rest = full & ~covered
        lowest = rest & -rest
        for mask in masks:
            if mask & lowest:
                cover(covered | mask, used + 1)

    cover(0, 0)
    return best


def test_bound_equals_brute_force_on_a_tiny_bound() -> None:
    graph = explore(RING._replace(requests=1, max_tokens=1)).graph
    paths = len(maximal_path_masks(graph))
    bound = walks_lower_bound(graph)
    assert bound == brute_force_walks(graph)
    assert 1 < bound < paths  # not trivial: walks share edges, and one walk is not enough


@st.composite
def rooted_dags(draw: st.DrawFn) -> nx.DiGraph:
    """A DAG on nodes 0..n-1 with edges only forward (u < v), every node reachable from 0."""
    n = draw(st.integers(2, 7))
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for v in range(1, n):
        graph.add_edge(draw(st.integers(0, v - 1)), v)  # a way in from below: reachable
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n) if not graph.has_edge(u, v)]
    graph.add_edges_from(draw(st.lists(st.sampled_from(pairs), max_size=6)) if pairs else [])
    return graph


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(rooted_dags())
def test_bound_equals_brute_force_on_small_dags(graph: nx.DiGraph) -> None:
    assert walks_lower_bound(graph) == brute_force_walks(graph)


def test_a_cycle_is_refused_by_name() -> None:
    graph = nx.DiGraph()
    graph.add_edge(0, 1, action="schedule(r0)")
    graph.add_edge(1, 2, action="combine(q=0)")
    graph.add_edge(2, 1, action="uncombine(q=0)")
    with pytest.raises(CycleError, match=r"cycle: 1 -\[combine\(q=0\)\] -> 2 -\[uncombine"):
        walks_lower_bound(graph)
    state = initial_state(RING)
    edges = Edges()
    for u, v, label in graph.edges(data="action"):
        edges.add(u, v, label)
    ex = Exploration(bounds=RING, states=[state] * 3, parent=[None] * 3, edges=edges)
    with pytest.raises(CycleError, match="walks are planned on a DAG"):
        Planner(Coverage(ex), random.Random(0))

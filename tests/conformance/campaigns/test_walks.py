"""Planned walks: the planner covers every edge with valid paths, the plan depends on the seed
alone (not on how many processes replay it), refusals are tried once per state, and a planted
bug is found by walks in worker processes, with a trace that replays it."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from ttmirror.conformance.bugs import BUG_VARIABLE
from ttmirror.conformance.campaigns import walks
from ttmirror.conformance.campaigns.coverage import Coverage, Planner
from ttmirror.conformance.campaigns.walk_bound import walks_lower_bound
from ttmirror.conformance.lockstep.harness import Lockstep
from ttmirror.conformance.lockstep.replay import CONFORMS, FAILS, replay
from ttmirror.model.actions import take
from ttmirror.model.explore import Exploration, explore
from ttmirror.model.state import RING, Bounds, initial_state

SMALL = RING._replace(requests=1)


@pytest.fixture(scope="module")
def small() -> Coverage:
    return Coverage(explore(SMALL))


def test_planner_covers_every_edge_with_paths_from_the_initial_state(small: Coverage) -> None:
    planner = Planner(Coverage(small.ex), random.Random(3))
    g, seen, count = small.ex.graph, set(), 0
    while (path := planner.plan()) is not None:
        count += 1
        edges = [planner.edge(e) for e in path]
        assert edges[0][0] == 0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(edges))
        assert set(edges) - seen, "every planned walk takes at least one new edge"
        seen |= set(edges)
        state = initial_state(SMALL)  # each edge's action leads where the graph says
        for e, (_, v) in zip(path, edges, strict=True):
            state = take(state, SMALL, planner.action(e))
            assert state == small.ex.states[v]
    assert seen == set(g.edges()) and planner.closed == g.number_of_edges()
    # No fewer walks than the DAG needs: one per unit of out-degree over in-degree.
    assert count >= sum(max(0, g.out_degree(u) - g.in_degree(u)) for u in g if u != 0)


def test_planner_gain_is_the_longest_path_of_open_edges(small: Coverage) -> None:
    planner = Planner(Coverage(small.ex), random.Random(0))
    for _ in range(20):
        planner.plan()
    planner.recompute()
    g = nx.DiGraph()
    for e in range(len(planner.target)):
        u, v = planner.edge(e)
        g.add_edge(u, v, w=planner.open[e])
    longest = nx.dag_longest_path_length(g, weight="w")
    assert planner.gain[0] == longest > 0


def test_the_plan_depends_on_the_seed_not_on_the_jobs(small: Coverage) -> None:
    one, two = Coverage(small.ex), Coverage(small.ex)
    a = walks.run(one, "tt", seed=5, until=1.0, seconds=math.inf, jobs=1)
    b = walks.run(two, "tt", seed=5, until=1.0, seconds=math.inf, jobs=2)
    assert a.failure is None and b.failure is None
    assert a.stopped == b.stopped == "covered" and one.edges_covered == 1.0
    assert a.walks == b.walks and one.edges == two.edges and a.steps == b.steps


def test_refusals_are_tried_once_per_model_state() -> None:
    refused: set = set()
    ls = Lockstep(SMALL, "cpu", refused=refused)
    tried = 0
    original = ls.refuse

    def counting(action, *, record=True):  # type: ignore[no-untyped-def]
        nonlocal tried
        tried += 1
        original(action, record=record)

    ls.refuse = counting  # type: ignore[method-assign]
    try:
        ls.act(ls.enabled("allocate")[0])
        first = tried
        assert first > 0 and ls.state in refused
    finally:
        ls.close()
    again = Lockstep(SMALL, "cpu", refused=refused)
    again.refuse = counting  # type: ignore[method-assign]
    try:
        again.act(again.enabled("allocate")[0])
        assert tried == first  # the same state: its refusals were already tried
    finally:
        again.close()


def test_walks_in_worker_processes_find_a_planted_bug_and_its_trace_replays(
    default_run: Exploration,
) -> None:
    bug = "prev-row-not-remapped"
    cov = Coverage(default_run)
    report = walks.run(cov, "tt", seed=0, until=1.0, seconds=math.inf, jobs=2, bug=bug)
    assert report.stopped == "failure" and report.failure is not None
    failed = report.failure
    moves = failed.moves[: failed.step + 1]
    assert replay(RING, "tt", failed.prompts, moves, bug=bug).status == FAILS
    assert replay(RING, "tt", failed.prompts, moves).status == CONFORMS


def _fuzz(tmp_path: Path, *args: str, bug: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != BUG_VARIABLE}
    if bug is not None:
        env[BUG_VARIABLE] = bug
    return subprocess.run(
        [sys.executable, "-m", "ttmirror.cli", "fuzz", "--requests", "1", "--examples", "20",
         "--jobs", "2", "--traces", str(tmp_path), *args],
        capture_output=True, text=True, timeout=600, env=env,
    )


def test_fuzz_json_contract_and_coverage(tmp_path: Path) -> None:
    done = _fuzz(tmp_path, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["actions_covered"] == 1.0 and report["edges_covered"] >= 0.95
    assert report["steps"] > 0 and report["steps_per_second"] > 0 and report["seed"] == 0
    assert report["stopped"] == "covered" and report["walks"] > 0 and report["jobs"] == 2
    # At one request the bound is what a brute-force search finds (test_walk_bound.py checks the
    # method); walks from the initial state can never beat it.
    bound = walks_lower_bound(explore(Bounds(requests=1)).graph)
    assert report["walks_lower_bound"] == bound > 1
    assert "edges_covered" in done.stderr  # progress went to stderr, not into the JSON


def test_fuzz_with_a_planted_bug_fails_with_a_trace_that_replays(tmp_path: Path) -> None:
    done = _fuzz(tmp_path, "--json", bug="guard-off")
    assert done.returncode == 1
    trace = json.loads(done.stdout)["trace"]
    assert trace and Path(trace).exists() and "seed 0" in done.stderr
    env = {**os.environ, BUG_VARIABLE: "guard-off"}
    again = subprocess.run([sys.executable, "-m", "ttmirror.cli", "replay", trace],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 1, again.stdout[-2000:]


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--min-edges", "2"], ["--seconds", "-1"]])
def test_fuzz_rejects_impossible_parameters_in_one_line(tmp_path: Path, args: list[str]) -> None:
    done = _fuzz(tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr

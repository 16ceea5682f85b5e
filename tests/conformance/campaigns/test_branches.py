"""Branch walks: every edge walked once from saved states, in one process or several, and a
planted bug found with a trace that replays from the initial state.

The default-bounds run (`ttmirror fuzz` to edges_covered 1.0) is `test_fuzz_default_bounds`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttmirror.conformance.bugs import BUG_VARIABLE
from ttmirror.conformance.campaigns import branches
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.lockstep.replay import CONFORMS, FAILS, replay
from ttmirror.model.explore import explore
from ttmirror.model.state import RING

SMALL = RING._replace(requests=1)


@pytest.fixture(scope="module")
def small() -> Coverage:
    return Coverage(explore(SMALL))


@pytest.mark.parametrize("backend", ["tt", "cpu"])
def test_one_process_walks_every_edge_once_from_saved_states(small: Coverage,
                                                             backend: str) -> None:
    cov = Coverage(small.ex)
    search = branches.Search(cov.index, SMALL, backend, seed=3)
    search.start_at_initial_state()
    assert search.walk(deadline=float("inf"))
    walked = search.take_walked()
    pairs = [(u, v) for u, v, _ in walked]
    assert len(pairs) == len(set(pairs)) == cov.total_edges  # each edge once, every edge
    assert set(pairs) == set(small.ex.graph.edges())
    # It really branched: runs were saved and restored, and the moves stay near one per edge
    # (walks from the initial state repeat their prefixes).
    assert search.saves > 0 and search.restores > 0
    assert cov.total_edges <= search.steps < 2 * cov.total_edges
    assert all(small.ex.states[v] in search.refused for v in {v for _, v in pairs})


def test_one_process_replays_its_search_from_the_seed(small: Coverage) -> None:
    runs = []
    for _ in range(2):
        cov = Coverage(small.ex)
        report = branches.run(cov, "tt", seed=7, seconds=math.inf, jobs=1)
        runs.append((report.stopped, report.walks, report.steps, cov.edges_covered))
    assert runs[0] == runs[1] and runs[0][0] == "covered" and runs[0][3] == 1.0


def test_worker_processes_share_the_branch_points_and_cover_every_edge(small: Coverage) -> None:
    cov = Coverage(small.ex)
    report = branches.run(cov, "tt", seed=0, seconds=math.inf, jobs=2)
    assert report.failure is None and report.stopped == "covered"
    assert cov.edges_covered == 1.0 and report.jobs == 2
    assert report.walks >= cov.total_edges  # a race may walk an edge twice, never skip one


def test_until_stops_the_search_once_reached(small: Coverage) -> None:
    cov = Coverage(small.ex)
    report = branches.run(cov, "tt", seed=0, seconds=math.inf, until=0.5, jobs=1)
    assert report.stopped == "covered" and 0.5 <= cov.edges_covered < 1.0


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_planted_bug_is_found_and_its_trace_replays_from_the_initial_state(
        small: Coverage, jobs: int) -> None:
    bug = "guard-off"
    cov = Coverage(small.ex)
    report = branches.run(cov, "tt", seed=0, seconds=math.inf, jobs=jobs, bug=bug)
    assert report.stopped == "failure" and report.failure is not None
    failed = report.failure
    moves = failed.moves[: failed.step + 1]
    assert moves[0].action.name == "allocate"  # the whole history, not the last branch
    assert replay(SMALL, "tt", failed.prompts, moves, sampling=failed.sampling,
                  sampling_seed=failed.sampling_seed, bug=bug).status == FAILS
    assert replay(SMALL, "tt", failed.prompts, moves, sampling=failed.sampling,
                  sampling_seed=failed.sampling_seed).status == CONFORMS


def test_fuzz_default_bounds(tmp_path: Path) -> None:
    """CI's full-coverage run: `ttmirror fuzz --json` at the ring's default sizes (`--state ring
    --no-subsets`) walks every edge. (The default bounds, state rows with vLLM's freedoms, have
    four times its edges; CI walks every edge of eight named bounds of state rows instead,
    `test_lockstep_state_rows.py`.)

    Its JSON is kept as out/fuzz-default.json (the figures the closing note and README quote).
    """
    env = {k: v for k, v in os.environ.items() if k != BUG_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror.cli", "fuzz", "--json", "--state", "ring",
         "--no-subsets", "--traces", str(tmp_path)],
        capture_output=True, text=True, timeout=1500, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["bounds"] == RING._asdict() | {"max_tokens_of": [], "host_sync_of": []}
    assert report["edges_covered"] == 1.0 and report["stopped"] == "covered"
    assert report["edges"] == report["total_edges"] > 100_000
    assert report["walk_mode"] == "branches" and report["failure"] is None
    out = Path("out")
    out.mkdir(exist_ok=True)
    (out / "fuzz-default.json").write_text(done.stdout)

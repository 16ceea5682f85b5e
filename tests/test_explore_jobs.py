"""The exploration spread over processes finds exactly what the serial search finds: the same
states under the same ids, the same parents, edges, verdicts and checks reached."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from ttmirror import explore_jobs
from ttmirror.model.explore import Exploration, Search, explore
from ttmirror.model.state import RING

BOUNDS = {
    "default": RING,
    "guard-off": RING._replace(guard=False),
    "depth-3-two-slots": RING._replace(depth=3, slots=2),
    "faults": RING._replace(faults=True),
    "release-at-issue": RING._replace(release_at="issue"),
    "one-request": RING._replace(requests=1, max_tokens=3),
}
FAILING = ("guard-off", "depth-3-two-slots", "release-at-issue")


def same(a: Exploration, b: Exploration) -> None:
    assert a.states == b.states
    assert a.parent == b.parent
    assert list(a.edges) == list(b.edges)
    for name in ("violations", "sometimes", "deadlocks", "cannot_finish", "finals",
                 "broken_nodes", "transitions"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("name", BOUNDS)
def test_jobs_find_what_the_serial_search_finds(name: str) -> None:
    serial = explore(BOUNDS[name])
    for jobs in (2, 3):
        same(serial, explore_jobs.explore(BOUNDS[name], jobs))
    # Not vacuous: big enough that levels really split, and the failing bounds do fail.
    assert len(serial.states) > 500
    assert bool(serial.violations) == (name in FAILING)


def test_spawned_workers_agree() -> None:
    """spawn: how workers start in a process with threads, such as this one once torch is
    loaded."""
    b = BOUNDS["depth-3-two-slots"]
    same(explore(b), explore_jobs.explore(b, 2, start="spawn"))


def test_forked_workers_agree_in_a_one_thread_process() -> None:
    """fork: how workers start in a one-thread process such as the CLI (checked in a fresh
    process: forking this one, which has threads, could copy a lock another thread holds)."""
    script = (
        "from ttmirror import explore_jobs\n"
        "from ttmirror.model.explore import explore\n"
        "from ttmirror.model.state import RING\n"
        "assert explore_jobs.start_method() == 'fork'\n"
        "b = RING._replace(depth=3, slots=2)\n"
        "a, c = explore(b), explore_jobs.explore(b, 2)\n"
        "assert a.states == c.states and a.parent == c.parent\n"
        "assert list(a.edges) == list(c.edges) and a.violations == c.violations\n"
        "print('same', len(a.states))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("same ")


def test_levels_are_split_and_merged_in_order() -> None:
    """Expanding a level in runs, and merging runs computed again from their recipes, gives
    the serial ids (in one process, so a failure is easy to read)."""
    b = RING._replace(depth=3, slots=2)
    serial, search = explore(b), Search(b)
    lo, hi, split = 0, 1, 0
    while lo < hi:
        cut = explore_jobs.runs(lo, hi, [1.0, 2.0, 1.0])
        out = [search.expand(r_lo, r_hi) for r_lo, r_hi in cut]
        split += sum(1 for chunk, new in out[1:] if new)
        lo, hi = search.merge([chunk for chunk, _ in out], 0, out[0][1])
    search.finish()
    same(serial, search.ex)
    assert split > 10  # later runs really found new states that had to be computed again


def test_a_worker_that_dies_ends_the_search_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    start = explore_jobs._Spread._start

    def start_then_kill(self: explore_jobs._Spread, *args: object) -> None:
        start(self, *args)  # type: ignore[arg-type]
        for worker in self.workers:
            worker.kill()
            worker.join()

    monkeypatch.setattr(explore_jobs._Spread, "_start", start_then_kill)
    with pytest.raises(explore_jobs.WorkerFailed, match="ended early"):
        explore_jobs.explore(RING._replace(requests=1), 2)


def test_runs_cover_the_level_in_order() -> None:
    for lo, hi, weights in ((0, 1, [1, 1]), (5, 6, [1, 1, 1]), (10, 1000, [1, 1]),
                            (3, 10, [1, 1, 1, 1]), (0, 1000, [1, 3])):
        cut = explore_jobs.runs(lo, hi, [float(w) for w in weights])
        assert len(cut) == len(weights) and cut[0][0] == lo and cut[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    assert explore_jobs.runs(0, 1000, [1.0, 3.0]) == [(0, 250), (250, 1000)]


def test_runs_follow_the_measured_rates() -> None:
    big = explore_jobs.BALANCE_MIN
    # The second process expanded twice as fast: its next run grows (halfway, to damp noise).
    weights = explore_jobs.rebalanced([0.5, 0.5], [(big, 2.0), (big, 1.0)])
    assert weights[1] > weights[0] and abs(sum(weights) - 1) < 1e-9
    assert explore_jobs.rebalanced([0.5, 0.5], [(10, 2.0), (10, 1.0)]) == [0.5, 0.5]


def test_check_says_the_same_with_any_number_of_jobs() -> None:
    out = []
    for jobs in ("1", "2"):
        done = subprocess.run([sys.executable, "-m", "ttmirror", "check", "--json", "--no-guard",
                               "--jobs", jobs], capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stderr
        report = json.loads(done.stdout)
        for key in ("seconds", "states_per_second"):
            report.pop(key)
        out.append(report)
    assert out[0] == out[1]
    assert out[0]["violated"] == "StaleHostIdsGuard" and out[0]["counterexample"]

"""The exploration spread over worker processes, one per core: the same `Exploration`, ids and
edges included, as the serial search, in less time.

Each process holds every state found so far. A level (a range of ids) is cut into one run per
process; each expands its run against the states known when the level began, then every
process merges all runs in level order, computing the other runs' new states again from their
recipes (parent and action), so all copies stay the same without states ever being sent.
Only this process keeps the edges and verdicts, so its runs are sized smaller, by each
process's measured rate. Workers start once, before the first level, each with its own search
from the bounds; a worker that dies ends the search with an error.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

from .model.explore import Chunk, Exploration, Level, Progress, Search, State
from .model.explore import explore as explore_here
from .model.state import Bounds


class WorkerFailed(RuntimeError):
    """A worker process of the search ended before the search did."""


def default_jobs() -> int:
    """One process per core."""
    return os.cpu_count() or 1


def explore(bounds: Bounds, jobs: int = 1, progress: Progress | None = None,
            start: str | None = None) -> Exploration:
    """`ttmirror.model.explore.explore` with ``jobs`` processes (this one included); ``start``
    is how workers start (default `start_method`)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be 1 or more, got {jobs}")
    if jobs == 1:
        return explore_here(bounds, progress)
    context = multiprocessing.get_context(start or start_method())
    spread = _Spread(jobs)
    try:
        return explore_here(bounds, progress, level=spread.level(context))
    finally:
        spread.close()


def start_method() -> str:
    """fork where this process has one thread (the CLI's case: fast); else spawn, since a fork
    copies the locks other threads hold (a test process with torch loaded has a few)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = threading.active_count()
    return "fork" if threads == 1 else "spawn"


def runs(lo: int, hi: int, weights: list[float]) -> list[tuple[int, int]]:
    """The level lo..hi-1 cut into one run per process, sized by ``weights``, in order."""
    total, below, cuts = sum(weights), 0.0, [lo]
    for weight in weights[:-1]:
        below += weight
        cuts.append(lo + round((hi - lo) * below / total))
    cuts.append(hi)
    return list(itertools.pairwise(cuts))


def rebalanced(weights: list[float], done: list[tuple[int, float]]) -> list[float]:
    """Weights for the next level from each process's (states expanded, seconds busy) in this
    one: each run sized to the process's rate, so that all finish together (the one keeping
    the record has more to merge). Small levels say nothing reliable and change nothing."""
    if min(n for n, _ in done) < BALANCE_MIN or min(t for _, t in done) <= 0:
        return weights
    rates = [n / t for n, t in done]
    return [(w / sum(weights) + r / sum(rates)) / 2 for w, r in zip(weights, rates, strict=True)]


BALANCE_MIN = 2000
"""States a run must have for its time to count in `rebalanced`."""


class _Spread:
    """This process's side: it expands run 0 and keeps the record; worker w expands run w."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pipes: list[Connection] = []
        self.workers: list[multiprocessing.process.BaseProcess] = []
        self.weights = [1.0] * jobs
        self.since = 0.0
        """When this process began merging the last level (its busy time runs from there)."""

    def level(self, context: BaseContext) -> Level:
        def expand_level(search: Search, lo: int, hi: int) -> tuple[list[Chunk], int, list[State]]:
            if not self.workers:  # the first level: the workers start with a search of their own
                self._start(context, search.bounds)
                self.since = time.perf_counter()
            cut = runs(lo, hi, self.weights)
            mine, new = search.expand(*cut[0])
            done = [(cut[0][1] - cut[0][0], time.perf_counter() - self.since)]
            chunks = [mine]
            for w, pipe in enumerate(self.pipes, start=1):
                try:
                    chunk, busy = pipe.recv()
                except EOFError:
                    raise WorkerFailed("a worker process of the search ended early") from None
                chunks.append(chunk)
                done.append((cut[w][1] - cut[w][0], busy))
            self.weights = rebalanced(self.weights, done)
            for w, pipe in enumerate(self.pipes, start=1):
                recipes = [None if c == w else chunk.recipes() for c, chunk in enumerate(chunks)]
                pipe.send((recipes, self.weights))
            self.since = time.perf_counter()
            return chunks, 0, new
        return expand_level

    def _start(self, context: BaseContext, bounds: Bounds) -> None:
        for w in range(1, self.jobs):
            mine, theirs = context.Pipe()
            worker = context.Process(target=_work,  # type: ignore[attr-defined]
                                     args=(bounds, w, self.jobs, theirs),
                                     name=f"explore-{w}", daemon=True)
            worker.start()
            theirs.close()
            self.pipes.append(mine)
            self.workers.append(worker)

    def close(self) -> None:
        # Not joined: a worker that finished is ending on its own (its memory going back to the
        # OS takes a while), and multiprocessing reaps it.
        for pipe in self.pipes:
            pipe.close()


def _work(bounds: Bounds, w: int, jobs: int, pipe: Connection) -> None:
    """Worker w: expand run w of each level, send it, merge every run as the record does. Its
    search begins as the record's did (the workers start before the first level)."""
    gc.disable()  # every state lives to the end (see `explore_here`)
    search = Search(bounds)
    lo, hi, weights = 0, 1, [1.0] * jobs
    since = time.perf_counter()
    try:
        while lo < hi:
            mine, new = search.expand(*runs(lo, hi, weights)[w])
            pipe.send((mine, time.perf_counter() - since))
            chunks, weights = pipe.recv()
            since = time.perf_counter()
            chunks[w] = mine
            lo, hi = search.merge(chunks, w, new, record=False)
    except (EOFError, BrokenPipeError):
        os._exit(1)  # the search ended without this worker (an error or an interrupt there)
    pipe.close()
    os._exit(0)  # freeing the copy of every state object by object would take seconds

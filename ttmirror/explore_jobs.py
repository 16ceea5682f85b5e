"""The exploration spread over worker processes, one per core: the same `Exploration`, ids and
edges included, as the serial search, in less time.

Each process holds every state found so far. A level (a range of ids) is cut into one run per
process; each expands its run against the states known when the level began, then every
process merges all runs in level order, computing the other runs' new states again from their
recipes (parent and action), so all copies stay the same without states ever being sent.
Only this process keeps the edges and verdicts. Workers are forked once, before the search,
while the heap is small; a worker that dies ends the search with an error.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext

from .model.explore import Chunk, Exploration, Level, Progress, Search, State
from .model.explore import explore as explore_here
from .model.state import Bounds


class WorkerFailed(RuntimeError):
    """A worker process of the search ended before the search did."""


def default_jobs() -> int:
    """One process per core."""
    return os.cpu_count() or 1


def explore(bounds: Bounds, jobs: int = 1, progress: Progress | None = None) -> Exploration:
    """`ttmirror.model.explore.explore` with ``jobs`` processes (this one included)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be 1 or more, got {jobs}")
    if jobs == 1:
        return explore_here(bounds, progress)
    context = multiprocessing.get_context("fork")  # the workers start from this process's search
    spread = _Spread(jobs)
    try:
        return explore_here(bounds, progress, level=spread.level(context))
    finally:
        spread.close()


def runs(lo: int, hi: int, jobs: int) -> list[tuple[int, int]]:
    """The level lo..hi-1 cut into ``jobs`` runs of nearly equal size, in order."""
    cuts = [lo + (hi - lo) * i // jobs for i in range(jobs + 1)]
    return list(itertools.pairwise(cuts))


class _Spread:
    """This process's side: it expands run 0 and keeps the record; worker w expands run w."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pipes: list[Connection] = []
        self.workers: list[multiprocessing.process.BaseProcess] = []

    def level(self, context: ForkContext) -> Level:
        def expand_level(search: Search, lo: int, hi: int) -> tuple[list[Chunk], int, list[State]]:
            if not self.workers:  # the first level: fork now, from the search as it begins
                self._start(context, search)
            mine, new = search.expand(*runs(lo, hi, self.jobs)[0])
            chunks = [mine]
            for pipe in self.pipes:
                try:
                    chunks.append(pipe.recv())
                except EOFError:
                    raise WorkerFailed("a worker process of the search ended early") from None
            for w, pipe in enumerate(self.pipes, start=1):
                pipe.send([None if c == w else chunk.recipes() for c, chunk in enumerate(chunks)])
            return chunks, 0, new
        return expand_level

    def _start(self, context: ForkContext, search: Search) -> None:
        for w in range(1, self.jobs):
            mine, theirs = context.Pipe()
            worker = context.Process(target=_work, args=(search, w, self.jobs, theirs),
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


def _work(search: Search, w: int, jobs: int, pipe: Connection) -> None:
    """Worker w: expand run w of each level, send it, merge every run as the record does."""
    lo, hi = 0, 1
    try:
        while lo < hi:
            mine, new = search.expand(*runs(lo, hi, jobs)[w])
            pipe.send(mine)
            chunks = pipe.recv()
            chunks[w] = mine
            lo, hi = search.merge(chunks, w, new, record=False)
    except (EOFError, BrokenPipeError):
        os._exit(1)  # the search ended without this worker (an error or an interrupt there)
    pipe.close()
    os._exit(0)  # freeing the copy of every state object by object would take seconds

"""Every edge of the explored graph walked once, from saved states instead of the initial one.

A depth-first search over the graph drives one run in lockstep. On reaching a model state for the
first time with more than one edge still to walk from it, it saves the run (`Lockstep.snapshot`:
model side, runner, mirror, emulated memory, queues, events, traces); the first edge goes on with
the live run, every other one with a run restored from the save. So each edge is walked once and
each state expanded once, and the moves total about the number of edges (each walk from the
initial state, as `walks.py` plans them, repeats a prefix: about 40 times more moves at the
default bounds).

Before each act the device may complete commands, as in the planned walks: each ready queue's
head, with chance `walks.DEVICE_MOVES`, drawn from one generator seeded by the seed (the search's
order is fixed by the graph, so a seed replays the search). A failure is reported with the run's
whole history from the initial state (restored runs carry their moves), so its trace replays
from the start like any other.

Saving needs the implementation's state as data: the emulated device or the cpu backend; a chip
cannot be saved, and there the planned walks from the initial state remain.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..model.actions import Action, successors
from ..model.state import State
from .coverage import Coverage
from .lockstep import SAMPLERS, Divergence, Lockstep, prompts_from
from .walk_bound import require_acyclic
from .walks import DEVICE_MOVES, FailedWalk, Report

type Progress = Callable[[Report, Coverage], None]


@dataclass
class _Frame:
    """A state being expanded: the edges left to walk from it, the run that reached it (used
    by the first edge) and its save (restored for every other edge)."""

    node: int
    todo: list[tuple[Action, State, int]]
    live: Lockstep | None
    saved: bytes | None


class Search:
    """The depth-first search of one process over `cov`'s graph."""

    def __init__(self, cov: Coverage, backend: str, *, seed: int, config: str | None = None
                 ) -> None:
        require_acyclic(cov.ex.graph)  # a state is expanded once: a cycle would never return
        self.cov, self.backend, self.seed, self.config = cov, backend, seed, config
        self.rng = random.Random(f"branches/{seed}")
        self.base = self.rng.randrange(64)
        self.sampling = self.rng.choice(SAMPLERS)
        self.refused: set[State] = set()
        self.expanded = bytearray(len(cov.ex.states))
        self.report = Report()
        self.saves = 0
        """Runs saved (at states with more than one edge to walk)."""
        self.restores = 0
        self.retired: Lockstep | None = None

    def run(self, *, seconds: float, progress: Progress | None = None, every: float = 5.0
            ) -> Report:
        """Walk every edge not yet covered, until done, `seconds` pass, or a run fails."""
        start = time.perf_counter()
        deadline, next_report = start + seconds, start + every
        report, cov = self.report, self.cov
        first = Lockstep(cov.ex.bounds, self.backend, prompts_from(self.base, cov.ex.bounds.requests),
                         refused=self.refused, config=self.config, sampling=self.sampling,
                         sampling_seed=self.base)
        stack = [self._frame(0, first)]
        try:
            while stack:
                now = time.perf_counter()
                if now >= deadline:
                    report.stopped = "budget"
                    break
                if progress is not None and now >= next_report:
                    report.seconds = now - start
                    progress(report, cov)
                    next_report = now + every
                frame = stack[-1]
                if not frame.todo:
                    stack.pop()
                    if frame.live is not None:
                        self._retire(frame.live)
                    continue
                action, target, v = frame.todo.pop()
                ls, frame.live = frame.live, None
                if ls is None:
                    assert frame.saved is not None
                    ls = Lockstep.restore(frame.saved, self.refused)
                    self.restores += 1
                before = len(ls.moves)
                try:
                    self._take(ls, action, target)
                except Divergence as d:
                    report.failure = FailedWalk(
                        report.walks, ls.prompts, list(ls.moves), list(ls.states), d.kind,
                        d.message, d.step, self.sampling, self.base)
                    report.steps += len(ls.moves) - before
                    self._retire(ls)
                    break
                report.steps += len(ls.moves) - before
                report.walks += 1
                cov.steps += len(ls.moves) - before
                cov.mark(frame.node, v, action.name)
                if self.expanded[v]:
                    self._retire(ls)
                else:
                    stack.append(self._frame(v, ls))
        finally:
            for frame in stack:
                if frame.live is not None:
                    frame.live.discard()
            stack.clear()
            self._retire(None)
            gc.collect()  # discarded runs are cycles: their ttnn host tensors go now, not at exit
        report.seconds = time.perf_counter() - start
        if report.failure is not None:
            report.stopped = "failure"
        elif not report.stopped:
            report.stopped = "covered" if len(cov.edges) == cov.total_edges else "exhausted"
        if progress is not None:
            progress(report, cov)
        return report

    def _retire(self, ls: Lockstep | None) -> None:
        """Discard the run retired last time, and keep `ls` until the next retirement: the
        next run is restored while one device is still open, so ttnn stays routed rather than
        being unrouted and routed again around every restore."""
        if self.retired is not None:
            self.retired.discard()
        self.retired = ls

    def _frame(self, u: int, ls: Lockstep) -> _Frame:
        """Expand state `u`, reached by `ls`: its edges still to walk (those not covered, and
        those leading to a state not expanded yet), saving `ls` if there is more than one."""
        self.expanded[u] = 1
        cov = self.cov
        index, edges, expanded = cov.index, cov.edges, self.expanded
        todo: list[tuple[Action, State, int]] = []
        seen: set[int] = set()
        for action, target in successors(ls.state, cov.ex.bounds):
            v = index[target]
            if v in seen:  # another action to the same state: the edge is one
                continue
            seen.add(v)
            if (u, v) not in edges or not expanded[v]:
                todo.append((action, target, v))
        todo.reverse()  # popped from the end: walked in the model's order
        saved = None
        if len(todo) > 1:
            saved = ls.snapshot()
            self.saves += 1
        return _Frame(u, todo, ls, saved)

    def _take(self, ls: Lockstep, action: Action, target: State) -> None:
        """Complete device commands at random (the device lags the host), then act."""
        rng = self.rng
        while rng.random() < DEVICE_MOVES:
            ready = [cq for cq in (0, 1) if ls.device_ready(cq)]
            if not ready:
                break
            ls.advance_device(rng.choice(ready))
        ls.act(action, target)

"""Coverage of the exhaustive graph, and walks steered toward what is not covered yet.

`Coverage` records which model actions and which edges of the explored state graph (same
bounds) a run exercised; every lockstep run reports its moves here. Random rules leave rare
edges unvisited, so `GuidedWalker` adds targeting in the spirit of MongoDB's spec walks: it
plans each walk on the graph, from the initial state along the path with the most uncovered
edges (a longest-path value per node over the DAG, refreshed every few walks), and replays it
against the implementation in lockstep, with device completions drawn from the seed between
the actions.

The graph is a DAG (every action makes progress or closes something), so each walk starts at
the initial state: at the default bounds that needs at least 165k walks for every edge (the
sum over states of out-degree minus in-degree), which is why full coverage there is a long
campaign rather than a CI run.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from ..model.actions import ALL_ACTIONS, Action, successors
from ..model.explore import Exploration
from ..model.state import State, initial_state
from .lockstep import Divergence, Lockstep, prompts_from


class Coverage:
    """Actions and graph edges exercised so far."""

    def __init__(self, ex: Exploration) -> None:
        self.ex = ex
        self.index: dict[State, int] = {s: i for i, s in enumerate(ex.states)}
        self.total_edges = ex.graph.number_of_edges()
        self.edges: set[tuple[int, int]] = set()
        self.actions: set[str] = set()
        self.steps = 0

    def record(self, ls: Lockstep) -> None:
        """Count the act moves of one run, up to its failure if it failed."""
        prev = self.index.get(initial_state(ls.bounds))
        for i, (move, state) in enumerate(zip(ls.moves, ls.states, strict=True)):
            if ls.failure is not None and i >= ls.failure.step:
                break
            self.steps += 1
            if move.kind != "act":
                continue
            node = self.index.get(state)
            if prev is not None and node is not None:
                self.edges.add((prev, node))
                self.actions.add(move.action.name)
            prev = node

    def mark(self, u: int, v: int, action: str) -> None:
        self.edges.add((u, v))
        self.actions.add(action)

    @property
    def edges_covered(self) -> float:
        return len(self.edges) / self.total_edges if self.total_edges else 1.0

    @property
    def actions_covered(self) -> float:
        return len(self.actions) / len(ALL_ACTIONS)


@dataclass
class WalkFailure:
    lockstep: Lockstep
    error: Divergence


class GuidedWalker:
    """Walks planned on the graph toward uncovered edges, replayed against the implementation."""

    def __init__(self, cov: Coverage, backend: str, rng: random.Random,
                 device_moves: float = 0.35, refresh: int = 25) -> None:
        self.cov = cov
        self.backend = backend
        self.rng = rng
        self.device_moves = device_moves
        self.refresh = refresh
        g = cov.ex.graph
        self.succ: list[list[int]] = [list(g.successors(u)) for u in range(g.number_of_nodes())]
        self.order = list(reversed(list(nx.topological_sort(g))))
        self.gain = [0] * len(self.succ)
        self.walks = 0
        self._recompute()

    def _recompute(self) -> None:
        """gain[u]: the most uncovered edges on any path from u (longest path in the DAG)."""
        covered, gain = self.cov.edges, self.gain
        for u in self.order:
            best = 0
            for v in self.succ[u]:
                value = gain[v] + ((u, v) not in covered)
                if value > best:
                    best = value
            gain[u] = best

    def plan(self) -> list[int]:
        """Node ids from the initial state along the most promising uncovered path."""
        covered, gain = self.cov.edges, self.gain
        path, u = [0], 0
        while self.succ[u]:
            scored = [(gain[v] + ((u, v) not in covered), self.rng.random(), v)
                      for v in self.succ[u]]
            best = max(scored)
            if best[0] == 0:
                break
            u = best[2]
            path.append(u)
        return path

    def walk(self) -> WalkFailure | None:
        """Plan one walk and replay it in lockstep; a failure comes back with its lockstep."""
        path = self.plan()
        if len(path) < 2:
            return None
        ex, b = self.cov.ex, self.cov.ex.bounds
        ls = Lockstep(b, self.backend, prompts_from(self.rng.randrange(64), b.requests))
        try:
            for u, v in itertools.pairwise(path):
                action, target = _action_to(ex.states[u], v, self.cov.index, b)
                self._device(ls)
                ls.act(action, expected=target)
                self.cov.mark(u, v, action.name)
                self.cov.steps += 1
        except Divergence as d:
            return WalkFailure(ls, d)
        finally:
            ls.close()
        self.walks += 1
        if self.walks % self.refresh == 0:
            self._recompute()
        else:  # exact along the walk just taken; elsewhere stale until the next refresh
            for u in reversed(path):
                self.gain[u] = max((self.gain[v] + ((u, v) not in self.cov.edges)
                                    for v in self.succ[u]), default=0)
        return None

    def _device(self, ls: Lockstep) -> None:
        while self.rng.random() < self.device_moves:
            ready = [cq for cq in (0, 1) if ls.device_ready(cq)]
            if not ready:
                return
            ls.advance_device(self.rng.choice(ready))
            self.cov.steps += 1

    def run(self, until: float, seconds: float, stop: Callable[[], bool] | None = None
            ) -> WalkFailure | None:
        """Walk until edges_covered reaches `until`, `seconds` pass, or a walk fails."""
        deadline = time.perf_counter() + seconds
        while self.cov.edges_covered < until and time.perf_counter() < deadline:
            if stop is not None and stop():
                break
            failure = self.walk()
            if failure is not None:
                return failure
            if self.gain[0] == 0:
                self._recompute()
                if self.gain[0] == 0:
                    break
        return None


def _action_to(s: State, v: int, index: dict[State, int], b: object) -> tuple[Action, State]:
    for action, t in successors(s, b):  # type: ignore[arg-type]
        if index.get(t) == v:
            return action, t
    raise LookupError(f"no action leads to state {v}")

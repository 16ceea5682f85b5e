"""Coverage of the exhaustive graph, and planning walks toward what is not covered yet.

`Coverage` records which model actions and which edges of the explored state graph (same
bounds) a run exercised; every lockstep run reports its moves here. Random rules leave rare
edges unvisited, so `Planner` adds targeting in the spirit of MongoDB's spec walks: it plans
each walk on the graph, from the initial state along the path with the most edges nobody has
walked yet (a longest-path value per node over the DAG), and `walks` replays it against the
implementation in lockstep.

The graph is a DAG (every action makes progress or closes something). These planned walks each
start at the initial state: what a chip allows, since its state cannot be saved. On the emulated
device and the cpu backend, `branches.py` walks every edge once from saved states instead.
"""

from __future__ import annotations

import random

import numpy as np

from ttmirror.conformance.campaigns.walk_bound import require_acyclic
from ttmirror.conformance.lockstep.harness import Lockstep
from ttmirror.model.actions import Action, actions_of, successors
from ttmirror.model.explore import Exploration
from ttmirror.model.state import State, initial_state


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
        """Edge (u, v) was walked by `action` and conformed."""
        self.edges.add((u, v))
        self.actions.add(action)

    @property
    def edges_covered(self) -> float:
        return len(self.edges) / self.total_edges if self.total_edges else 1.0

    @property
    def actions_covered(self) -> float:
        return len(self.actions) / len(actions_of(self.ex.bounds))


def edge_pairs(ex: Exploration) -> list[tuple[int, int]]:
    """The graph's edges sorted by (source, target): an edge's id is its position here (the
    planner's numbering, and the one shard reports use)."""
    return sorted(ex.graph.edges())


class Planner:
    """Walks on the graph, each along the path with the most edges not yet planned.

    Edges are numbered by source (CSR): edge e goes from `source[e]` to `target[e]`, and the
    out-edges of u are `start[u]:start[u + 1]`. `gain[u]` is the most unplanned edges on any
    path from u; it is exact after `recompute` (a longest-path pass over the DAG, level by level
    in numpy) and along every planned path, and may overestimate elsewhere in between.
    """

    def __init__(self, cov: Coverage, rng: random.Random, refresh: int = 50,
                 fresh: bool = False) -> None:
        """`fresh`: plan every edge, as if none were covered yet (a shard's plan must be the
        same on every machine, whatever each one's Hypothesis phase covered)."""
        self.cov, self.rng, self.refresh = cov, rng, refresh
        ex = cov.ex
        require_acyclic(ex.graph)  # `_by_level` would never end on a cycle: refuse it by name
        n = len(ex.states)
        pairs = edge_pairs(ex)
        self.source = np.fromiter((u for u, _ in pairs), dtype=np.int64, count=len(pairs))
        self.target_array = np.fromiter((v for _, v in pairs), dtype=np.int64, count=len(pairs))
        self.target: list[int] = self.target_array.tolist()
        self.start: list[int] = np.searchsorted(self.source, np.arange(n + 1)).tolist()
        # One byte per edge, 1 = not planned yet; numpy sees the same bytes without a copy.
        self.open = bytearray(b"\x01") * len(pairs)
        self._open_view = np.frombuffer(self.open, dtype=np.uint8)
        covered = () if fresh else cov.edges
        for u, v in covered:
            self.open[self._edge(u, v)] = 0
        self.closed = len(covered)
        """Edges covered or planned."""
        self._levels = self._by_level(n)
        self.gain: list[int] = []
        self._actions: dict[int, Action] = {}
        self.planned = 0
        self.recompute()

    def _edge(self, u: int, v: int) -> int:
        lo, hi = self.start[u], self.start[u + 1]
        return lo + self.target[lo:hi].index(v)

    def _by_level(self, n: int) -> list[np.ndarray]:
        """Edge ids grouped by the height of their source (longest distance to a sink)."""
        height = np.zeros(n, dtype=np.int64)
        changed = True
        while changed:  # at most (longest path) passes; each is vectorised over all edges
            candidate = np.zeros(n, dtype=np.int64)
            np.maximum.at(candidate, self.source, height[self.target_array] + 1)
            changed = bool((candidate != height).any())
            height = candidate
        edge_height = height[self.source]
        return [np.flatnonzero(edge_height == h) for h in range(1, int(height.max()) + 1)]

    def recompute(self) -> None:
        """gain[u] exactly: the longest path in unplanned edges from u, lowest levels first."""
        gain = np.zeros(len(self.start) - 1, dtype=np.int64)
        for group in self._levels:
            value = gain[self.target_array[group]] + self._open_view[group]
            np.maximum.at(gain, self.source[group], value)
        self.gain = gain.tolist()

    def plan(self) -> list[int] | None:
        """The edge ids of the next walk, marked as planned; None when nothing is left."""
        if self.planned and self.planned % self.refresh == 0:  # __init__ computed the first
            self.recompute()
        path = self._greedy()
        if not path:  # stale gains led nowhere new: refresh once and retry
            self.recompute()
            path = self._greedy()
        if not path:
            return None
        for e in path:
            self.closed += self.open[e]
            self.open[e] = 0
        open_, gain, target, start = self.open, self.gain, self.target, self.start
        for e in reversed(path):  # exact again along the path just planned
            u = int(self.source[e])
            gain[u] = max(gain[target[f]] + open_[f] for f in range(start[u], start[u + 1]))
        self.planned += 1
        return path

    def _greedy(self) -> list[int]:
        open_, gain, target, start, rng = self.open, self.gain, self.target, self.start, self.rng
        path: list[int] = []
        u, new = 0, 0
        while start[u] < start[u + 1]:
            best, best_key = -1, (0, 0.0)
            for e in range(start[u], start[u + 1]):
                key = (gain[target[e]] + open_[e], rng.random())
                if key > best_key:
                    best, best_key = e, key
            if best < 0 or best_key[0] == 0:
                break
            new += open_[best]
            path.append(best)
            u = target[best]
        return path if new else []

    def action(self, e: int) -> Action:
        """The model action that takes edge e (the first one, where several lead to one state)."""
        found = self._actions.get(e)
        if found is None:
            u = int(self.source[e])
            index = self.cov.index
            edge_to = {self.target[f]: f for f in range(self.start[u], self.start[u + 1])}
            for a, t in successors(self.cov.ex.states[u], self.cov.ex.bounds):
                self._actions.setdefault(edge_to[index[t]], a)
            found = self._actions[e]
        return found

    def edge(self, e: int) -> tuple[int, int]:
        return int(self.source[e]), self.target[e]

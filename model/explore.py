"""Exhaustive breadth-first exploration of the model into a networkx state graph.

Nodes are integer state ids (``Exploration.states[id]`` is the state); each edge carries the
action label. Breadth-first order makes every counterexample a shortest path. States that
break an invariant are recorded and not expanded further.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from .actions import Action, is_final, successors
from .invariants import INVARIANTS, SOMETIMES
from .state import Bounds, State, initial_state, validate_bounds

type Progress = Callable[[int, int, int], None]
"""Called now and then with (states, transitions, frontier size)."""


class Edges:
    """The transitions, compactly: three parallel integer arrays and a table of action labels.

    A million-state graph has millions of edges; as networkx dictionaries they would cost more
    time and memory than the search. `Exploration.graph` builds the networkx graph from these
    only when something asks for it (views, coverage); the checks run on the arrays.
    """

    def __init__(self) -> None:
        self.src = array("i")
        self.dst = array("i")
        self.label = array("i")
        """Index into `labels` per edge."""
        self.labels: list[str] = []
        self._label_ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.src)

    def add(self, u: int, v: int, label: str) -> None:
        """Record the transition u -label-> v."""
        lid = self._label_ids.get(label)
        if lid is None:
            lid = self._label_ids[label] = len(self.labels)
            self.labels.append(label)
        self.src.append(u)
        self.dst.append(v)
        self.label.append(lid)

    def __iter__(self) -> Iterator[tuple[int, int, str]]:
        labels = self.labels
        for u, v, lid in zip(self.src, self.dst, self.label, strict=True):
            yield u, v, labels[lid]

    def predecessors(self, nodes: int) -> tuple[array[int], array[int]]:
        """The reverse adjacency in compressed form: node v's predecessors are
        ``preds[start[v]:start[v + 1]]``."""
        start = array("i", bytes(4 * (nodes + 1)))
        for v in self.dst:
            start[v + 1] += 1
        for n in range(nodes):
            start[n + 1] += start[n]
        fill = array("i", start)
        preds = array("i", bytes(4 * len(self.dst)))
        for u, v in zip(self.src, self.dst, strict=True):
            preds[fill[v]] = u
            fill[v] += 1
        return start, preds

    def to_graph(self, nodes: int) -> nx.DiGraph:
        """The networkx graph: one edge per (source, target), parallel actions' labels joined
        by " | " in the order they were found."""
        labels: dict[tuple[int, int], str] = {}
        for u, v, label in self:
            key = (u, v)
            labels[key] = labels[key] + " | " + label if key in labels else label
        graph = nx.DiGraph()
        graph.add_nodes_from(range(nodes))
        graph.add_edges_from((u, v, {"action": label}) for (u, v), label in labels.items())
        return graph


@dataclass
class Exploration:
    """Everything the search found."""

    bounds: Bounds
    states: list[State]
    parent: list[tuple[int, Action] | None]
    edges: Edges = field(default_factory=Edges)
    violations: dict[str, int] = field(default_factory=dict)
    """Invariant name -> id of the first (shallowest) state that breaks it."""
    sometimes: dict[str, bool] = field(default_factory=dict)
    """Applicable "sometimes" check -> reached at least once."""
    deadlocks: list[int] = field(default_factory=list)
    cannot_finish: list[int] = field(default_factory=list)
    finals: list[int] = field(default_factory=list)
    broken_nodes: set[int] = field(default_factory=set)
    transitions: int = 0
    seconds: float = 0.0
    _graph: nx.DiGraph | None = field(default=None, repr=False)

    @property
    def graph(self) -> nx.DiGraph:
        """The state graph as networkx: nodes are state ids, each edge's "action" its label(s).
        Built on first use, then kept."""
        if self._graph is None:
            self._graph = self.edges.to_graph(len(self.states))
        return self._graph

    @property
    def ok(self) -> bool:
        """Every invariant holds, no deadlock, every request can always still finish."""
        return not self.violations and not self.deadlocks and not self.cannot_finish

    def path_to(self, node: int) -> list[tuple[Action, int]]:
        """The shortest path from the initial state: (action, state reached) per step."""
        path: list[tuple[Action, int]] = []
        while (link := self.parent[node]) is not None:
            prev, action = link
            path.append((action, node))
            node = prev
        path.reverse()
        return path

    def first_violation(self) -> tuple[str, int] | None:
        """The invariant broken nearest the initial state, and the state where it breaks."""
        if not self.violations:
            return None
        name = min(self.violations, key=lambda n: (len(self.path_to(self.violations[n])), n))
        return name, self.violations[name]

    def failure(self) -> tuple[str, int] | None:
        """The property to report and its witness state: an invariant, else a deadlock."""
        first = self.first_violation()
        if first is not None:
            return first
        if self.deadlocks:
            return "NoDeadlock", min(self.deadlocks, key=lambda n: len(self.path_to(n)))
        if self.cannot_finish:
            return "CanAlwaysFinish", min(self.cannot_finish, key=lambda n: len(self.path_to(n)))
        return None


def explore(bounds: Bounds, progress: Progress | None = None, every: int = 5000) -> Exploration:
    """Visit every reachable state within ``bounds`` and check every property."""
    validate_bounds(bounds)
    start = time.perf_counter()
    search = _Search(bounds)
    ex, frontier = search.ex, search.frontier
    # Every state found lives until the end: the cycle collector would only walk the growing
    # heap again and again (a third of the time at a million states) and find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        while frontier:
            node = frontier.popleft()
            search.visit(node)
            if progress is not None and node % every == 0:  # node ids count the expansions
                progress(len(ex.states), ex.transitions, len(frontier))
        search.finish()
    finally:
        if collecting:
            gc.enable()
    ex.seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(ex.states), ex.transitions, 0)
    return ex


class _Search:
    """One breadth-first search: the states seen, the frontier, and each edge's label."""

    def __init__(self, bounds: Bounds) -> None:
        init = initial_state(bounds)
        self.bounds = bounds
        self.ex = Exploration(bounds=bounds, states=[init], parent=[None])
        self.index: dict[State, int] = {init: 0}
        self.frontier: deque[int] = deque([0])
        checks = [c for c in SOMETIMES if c.applies(bounds)]
        self.ex.sometimes = {c.name: False for c in checks}
        self.pending = checks
        """The "sometimes" checks not reached yet."""
        self.label_of: dict[Action, str] = {}

    def visit(self, node: int) -> None:
        """Check a state's invariants, then expand it (unless it is broken)."""
        ex, s, bounds = self.ex, self.ex.states[node], self.bounds
        broken = [inv.name for inv in INVARIANTS if not inv.holds(s, bounds)]
        if broken:
            ex.broken_nodes.add(node)
            for name in broken:
                ex.violations.setdefault(name, node)
            return  # a broken state is a counterexample's end: nothing beyond it matters
        moved = 0
        for action, t in successors(s, bounds):
            moved += 1
            self.edge(node, s, action, t)
        ex.transitions += moved
        if not moved:
            (ex.finals if is_final(s) else ex.deadlocks).append(node)

    def edge(self, node: int, s: State, action: Action, t: State) -> None:
        """Record the transition s -action-> t, discovering t if it is new."""
        ex = self.ex
        target = self.index.get(t)
        if target is None:
            target = len(ex.states)
            self.index[t] = target
            ex.states.append(t)
            ex.parent.append((node, action))
            self.frontier.append(target)
        label = self.label_of.get(action)
        if label is None:
            label = self.label_of[action] = action.label()
        ex.edges.add(node, target, label)
        if self.pending:
            for check in list(self.pending):
                if check.reached(s, action, t):
                    ex.sometimes[check.name] = True
                    self.pending.remove(check)

    def finish(self) -> None:
        """Check that every state can finish."""
        self.ex.cannot_finish = _cannot_finish(self.ex)


def _cannot_finish(ex: Exploration) -> list[int]:
    """States from which no path leads to a final state (every request closed).

    A broken state is not expanded, so states whose every way out runs through one are
    excused: they are that invariant's counterexample, not a liveness failure of their own.
    """
    nodes = len(ex.states)
    start, preds = ex.edges.predecessors(nodes)
    can = bytearray(nodes)
    todo = [*ex.finals, *ex.broken_nodes]
    for n in todo:
        can[n] = 1
    while todo:
        node = todo.pop()
        for p in preds[start[node]:start[node + 1]]:
            if not can[p]:
                can[p] = 1
                todo.append(p)
    return [n for n in range(nodes) if not can[n]]


def changed_variables(before: State, after: State) -> str:
    """The variables an action changed, e.g. ``queue[1], slots[0]`` (the full view's edge
    labels)."""
    out: list[str] = []
    for name, a, b in zip(State._fields, before, after, strict=True):
        if a == b:
            continue
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            out.extend(f"{name}[{i}]" for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        else:
            out.append(name)
    return ", ".join(out)


def changes(before: State, after: State) -> dict[str, Any]:
    """The variables an action changed, as dotted paths to their new values."""
    out: dict[str, Any] = {}
    _diff("", before, after, out)
    return out


def _diff(path: str, a: Any, b: Any, out: dict[str, Any]) -> None:
    if a == b:
        return
    if isinstance(a, tuple) and isinstance(b, tuple) and hasattr(a, "_fields") and type(a) is type(
        b
    ):
        for name in a._fields:
            _diff(f"{path}.{name}" if path else name, getattr(a, name), getattr(b, name), out)
        return
    if (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and a
        and hasattr(a[0], "_fields")
    ):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(f"{path}[{i}]", x, y, out)
        return
    out[path] = b

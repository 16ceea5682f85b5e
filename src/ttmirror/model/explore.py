"""Exhaustive breadth-first exploration of the model into a state graph.

Nodes are integer state ids (``Exploration.states[id]`` is the state); each edge carries the
action label (kept as arrays; `Exploration.graph` is the networkx view). Breadth-first order
makes every counterexample a shortest path. States that break an invariant are recorded and
not expanded further.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from .actions import Action, is_final, successors, take
from .invariants import GRAPH_PROPERTIES, SOMETIMES, invariants_for
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

    def intern(self, label: str) -> int:
        """The index of ``label`` in `labels`, added if new."""
        lid = self._label_ids.get(label)
        if lid is None:
            lid = self._label_ids[label] = len(self.labels)
            self.labels.append(label)
        return lid

    def add(self, u: int, v: int, label: str) -> None:
        """Record the transition u -label-> v."""
        self.src.append(u)
        self.dst.append(v)
        self.label.append(self.intern(label))

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


type Level = Callable[["Search", int, int], tuple[list["Chunk"], int, list[State]]]
"""Expands one level, the node range lo..hi-1: its chunks in level order, which of them this
process expanded, and that chunk's new states (`Search.expand`'s result). The default expands
it whole here; `ttmirror.explore_jobs` spreads it over processes."""


def explore(bounds: Bounds, progress: Progress | None = None,
            level: Level | None = None) -> Exploration:
    """Visit every reachable state within ``bounds`` and check every property.

    Breadth-first, a level at a time: a level's states are a range of ids (ids are given in
    the order states are found); each run of it is expanded against the states known when the
    level began, and the runs are merged in order, so that however a level is split, ids,
    parents and edges are the serial search's.
    """
    validate_bounds(bounds)
    start = time.perf_counter()
    search = Search(bounds)
    ex = search.ex
    expand_level = level or _whole_level
    # Every state found lives until the end: the cycle collector would only walk the growing
    # heap again and again (a third of the time at a million states) and find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        lo, hi = 0, 1
        while lo < hi:
            chunks, own, own_new = expand_level(search, lo, hi)
            lo, hi = search.merge(chunks, own, own_new)
            if progress is not None:
                progress(len(ex.states), ex.transitions, hi - lo)
        search.finish()
    finally:
        if collecting:
            gc.enable()
    ex.seconds = time.perf_counter() - start
    return ex


def _whole_level(search: Search, lo: int, hi: int) -> tuple[list[Chunk], int, list[State]]:
    chunk, new = search.expand(lo, hi)
    return [chunk], 0, new


@dataclass
class Chunk:
    """What expanding one run of a level's states found, told apart from what was known when
    the level began, so that runs expanded apart (in other processes) merge into exactly the
    serial search's result.

    A target ``v < 0`` is the run's own new state ``-1 - v``; each new state comes with the
    edge that found it first (its recipe: parent and action), from which any process holding
    the parent computes it again.
    """

    src: array[int] = field(default_factory=lambda: array("i"))
    dst: array[int] = field(default_factory=lambda: array("i"))
    action: array[int] = field(default_factory=lambda: array("i"))
    """Index into `actions` per edge."""
    actions: list[Action] = field(default_factory=list)
    new_parent: array[int] = field(default_factory=lambda: array("i"))
    new_action: array[int] = field(default_factory=lambda: array("i"))
    broken: list[tuple[int, list[str]]] = field(default_factory=list)
    finals: list[int] = field(default_factory=list)
    deadlocks: list[int] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)
    """The "sometimes" checks this run reached."""

    def recipes(self) -> Chunk:
        """The part another process needs to keep its copy of the states: the new states'
        recipes (and what was reached, so it stops checking it)."""
        return Chunk(actions=self.actions, new_parent=self.new_parent,
                     new_action=self.new_action, reached=self.reached)


class Search:
    """One breadth-first search: the states seen (ids, parents), the edges, the verdicts, and
    the "sometimes" checks not reached yet."""

    def __init__(self, bounds: Bounds) -> None:
        init = initial_state(bounds)
        self.bounds = bounds
        self.ex = Exploration(bounds=bounds, states=[init], parent=[None])
        self.index: dict[State, int] = {init: 0}
        checks = [c for c in SOMETIMES if c.applies(bounds)]
        self.ex.sometimes = {c.name: False for c in checks}
        self.pending = checks
        """The "sometimes" checks not reached yet (as far as this process knows)."""

    def expand(self, lo: int, hi: int) -> tuple[Chunk, list[State]]:
        """Check and expand the states lo..hi-1 of the current level against the states known
        so far, changing nothing: the run's chunk and its new states."""
        bounds, states, index = self.bounds, self.ex.states, self.index
        invariants = invariants_for(bounds)
        chunk, new = Chunk(), list[State]()
        local: dict[State, int] = {}
        action_ids: dict[Action, int] = {}
        src, dst, act = chunk.src, chunk.dst, chunk.action
        for node in range(lo, hi):
            s = states[node]
            broken = [inv.name for inv in invariants if not inv.holds(s, bounds)]
            if broken:
                chunk.broken.append((node, broken))
                continue  # a broken state is a counterexample's end
            moved = False
            for action, t in successors(s, bounds):
                moved = True
                aid = action_ids.get(action)
                if aid is None:
                    aid = action_ids[action] = len(chunk.actions)
                    chunk.actions.append(action)
                target = index.get(t)
                if target is None:
                    target = local.setdefault(t, -1 - len(new))
                    if target == -1 - len(new):
                        new.append(t)
                        chunk.new_parent.append(node)
                        chunk.new_action.append(aid)
                src.append(node)
                dst.append(target)
                act.append(aid)
                if self.pending:
                    for check in list(self.pending):
                        if check.reached(s, action, t, bounds):
                            chunk.reached.append(check.name)
                            self.pending.remove(check)
            if not moved:
                (chunk.finals if is_final(s) else chunk.deadlocks).append(node)
        return chunk, new

    def merge(self, chunks: list[Chunk], own: int, own_new: list[State],
              record: bool = True) -> tuple[int, int]:
        """Add the level's chunks, in level order, as the serial search would have found them:
        ``chunks[own]``'s new states are ``own_new``, the others' are computed again from
        their recipes. With ``record``, the edges and verdicts too (one process keeps them).
        Returns the next level's node range."""
        ex, index, states, bounds = self.ex, self.index, self.ex.states, self.bounds
        first = len(states)
        reached = {name for chunk in chunks for name in chunk.reached}
        if reached:
            self.pending = [c for c in self.pending if c.name not in reached]
        for c, chunk in enumerate(chunks):
            ids = array("i")
            for local, (node, aid) in enumerate(zip(chunk.new_parent, chunk.new_action,
                                                    strict=True)):
                action = chunk.actions[aid]
                t = own_new[local] if c == own else take(states[node], bounds, action)
                assert t is not None, f"{action.label()} is not enabled where it was taken"
                gid = index.setdefault(t, len(states))
                if gid == len(states):
                    states.append(t)
                    if record:
                        ex.parent.append((node, action))
                ids.append(gid)
            if record:
                self._record(chunk, ids)
        return first, len(states)

    def _record(self, chunk: Chunk, ids: array[int]) -> None:
        """Keep one chunk's edges and verdicts, its new states numbered ``ids``."""
        ex, edges = self.ex, self.ex.edges
        for node, names in chunk.broken:
            ex.broken_nodes.add(node)
            for name in names:
                ex.violations.setdefault(name, node)
        ex.finals += chunk.finals
        ex.deadlocks += chunk.deadlocks
        for name in chunk.reached:
            ex.sometimes[name] = True
        labels = [edges.intern(a.label()) for a in chunk.actions]
        edges.src.extend(chunk.src)
        edges.dst.extend(array("i", [v if v >= 0 else ids[-1 - v] for v in chunk.dst]))
        edges.label.extend(array("i", [labels[a] for a in chunk.action]))
        ex.transitions += len(chunk.src)

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


def verdicts(ex: Exploration) -> dict[str, str]:
    """Invariant and graph property name -> "ok" or "violated"."""
    out = {inv.name: ("violated" if inv.name in ex.violations else "ok")
           for inv in invariants_for(ex.bounds)}
    out["NoDeadlock"] = "violated" if ex.deadlocks else "ok"
    out["CanAlwaysFinish"] = "violated" if ex.cannot_finish else "ok"
    assert set(GRAPH_PROPERTIES) <= set(out)
    return out

"""Projected views of the explored state graph, for reviewers.

The full product graph is far too big to read past tiny bounds, so each view projects every
state onto a few variables (one slot's lifecycle, one request's lifecycle) and keeps the
edges whose action changes the projection, labelled with the action names. A failing
variant's counterexample path is carried into the view so renderers can colour it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from ttmirror.model.actions import in_flight, writer
from ttmirror.model.explore import Exploration, changed_variables, changes
from ttmirror.model.state import Phase, State, Step

FULL_VIEW_LIMIT = 3000
"""The full view refuses graphs larger than this: nobody can read them, use a projection."""


@dataclass
class View:
    """A small labelled graph: nodes are projected states, edges carry action names."""

    title: str
    nodes: dict[str, str] = field(default_factory=dict)
    """Node id -> label."""
    edges: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(source, target) -> action labels."""
    initial: str | None = None
    path_nodes: list[str] = field(default_factory=list)
    """The counterexample's nodes in order (empty when everything holds)."""
    path_edges: set[tuple[str, str]] = field(default_factory=set)
    violation: str | None = None


def slot_phase(s: State, slot: int) -> str:
    """One slot's lifecycle: who wrote it and which readers are still to come."""
    if not s.allocated:
        return "unallocated"
    st = s.slots[slot]
    if st.content is None:
        return "free"
    if st.released:
        return "released"
    readers = []
    w = writer(s, slot)
    if w is not None and s.queue[w].phase < Phase.READBACK_DONE:
        phase = s.queue[w].phase
        readers.append("readback issued" if phase == Phase.READBACK_ISSUED else "readback due")
    if any(step.src_slot == slot and step.phase == Phase.SCHEDULED for step in s.queue):
        readers.append("combine due")
    owner = "writer in flight" if w is not None else "writer retired"
    return f"written, {owner}" + (": " + ", ".join(readers) if readers else ": no readers")


def request_phase(s: State, req: int) -> str:
    """One request's lifecycle: status, tokens delivered, where its newest token lives."""
    r = s.requests[req]
    n = in_flight(s, req)
    where = f"newest on device ({n} in flight)" if n else "newest on host"
    return f"{r.status.name.lower()}, {len(r.delivered)} delivered, {where}"


def project(ex: Exploration, view: str, index: int = 0) -> View:
    """The ``view`` ("slot", "request" or "full") of the explored graph."""
    if view == "full":
        return _full(ex)
    if view == "slot":
        if not 0 <= index < ex.bounds.slots:
            raise ValueError(f"--slot must be between 0 and {ex.bounds.slots - 1}, got {index}")

        def key(s: State) -> str:
            return slot_phase(s, index)

        title = f"slot {index} lifecycle"
    elif view == "request":
        if not 0 <= index < ex.bounds.requests:
            raise ValueError(
                f"--request must be between 0 and {ex.bounds.requests - 1}, got {index}"
            )

        def key(s: State) -> str:
            return request_phase(s, index)

        title = f"request {index} lifecycle"
    else:
        raise ValueError(f"unknown view {view!r}")
    keys = [key(s) for s in ex.states]
    ids: dict[str, str] = {}
    out = View(title=title)
    for k in keys:
        if k not in ids:
            ids[k] = f"n{len(ids)}"
            out.nodes[ids[k]] = k
    out.initial = ids[keys[0]]
    for u, v, data in ex.graph.edges(data=True):
        a, b = ids[keys[u]], ids[keys[v]]
        if a != b:
            names = {label.split("(")[0] for label in data["action"].split(" | ")}
            out.edges.setdefault((a, b), set()).update(names)
    _mark_failure(ex, out, [ids[k] for k in keys])
    return out


def _full(ex: Exploration) -> View:
    if len(ex.states) > FULL_VIEW_LIMIT:
        raise ValueError(
            f"the full graph has {len(ex.states)} states (limit {FULL_VIEW_LIMIT}): "
            "use --view slot or --view request, or smaller bounds"
        )
    out = View(title="full state graph")
    for n, s in enumerate(ex.states):
        out.nodes[f"n{n}"] = summarize(s)
    out.initial = "n0"
    for u, v, data in ex.graph.edges(data=True):
        changed = changed_variables(ex.states[u], ex.states[v])
        out.edges[(f"n{u}", f"n{v}")] = {f"{data['action']} [{changed}]"}
    _mark_failure(ex, out, [f"n{n}" for n in range(len(ex.states))])
    return out


def counterexample_view(ex: Exploration) -> View:
    """Just the failing path: each state summarised, each edge with what it changed."""
    failure = ex.failure()
    if failure is None:
        raise ValueError("nothing fails at these bounds: there is no counterexample to draw")
    name, node = failure
    out = View(title=f"counterexample: {name}", violation=name)
    out.nodes["n0"] = summarize(ex.states[0])
    out.initial = "n0"
    out.path_nodes = ["n0"]
    prev = 0
    for i, (action, target) in enumerate(ex.path_to(node), start=1):
        nid = f"n{i}"
        out.nodes[nid] = summarize(ex.states[target])
        delta = changes(ex.states[prev], ex.states[target])
        label = action.label() + "".join(f"\n{k} = {_short(v)}" for k, v in delta.items())
        out.edges[(out.path_nodes[-1], nid)] = {label}
        out.path_edges.add((out.path_nodes[-1], nid))
        out.path_nodes.append(nid)
        prev = target
    return out


def _mark_failure(ex: Exploration, out: View, ids: list[str]) -> None:
    failure = ex.failure()
    if failure is None:
        return
    name, node = failure
    out.violation = name
    prev = ids[0]
    out.path_nodes = [prev]
    for _action, target in ex.path_to(node):
        nid = ids[target]
        if nid != prev:
            out.path_edges.add((prev, nid))
            out.path_nodes.append(nid)
        prev = nid


def summarize(s: State) -> str:
    """A compact one-state label: queue, slots, requests."""
    if not s.allocated:
        return "not loaded"
    queue = " ".join(_step(st) for st in s.queue) or "idle"
    slots = " ".join(
        "-" if sl.content is None else ("rel" if sl.released else "w") for sl in s.slots
    )
    reqs = " ".join(f"r{i} {r.status.name[:3].lower()}{len(r.delivered)}"
                    for i, r in enumerate(s.requests))
    broken = f" BROKEN {sorted(s.broken)}" if s.broken else ""
    return f"{queue} | slots {slots} | {reqs}{broken}"


def _short(value: object) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, Step) for v in value):
        text = " ".join(_step(v) for v in value)
    elif isinstance(value, Step):
        text = _step(value)
    elif isinstance(value, IntEnum):
        text = value.name
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _step(st: Step) -> str:
    """``[s1 scheduled r0@1m]``: slot, phase, rows (req@pos, m=mirror, h=host, x=dropped)."""
    rows = ",".join(
        f"r{r.req}@{r.pos}{'m' if r.prev_row is not None else 'h'}" if r.live else "x"
        for r in st.rows
    )
    return f"[s{st.slot} {st.phase.name.lower()} {rows}]"

"""The fewest walks from the initial state that walk every edge of the state graph: a minimum flow.

A walk is a path from the initial state that may stop anywhere. Give every edge a lower bound of
one unit of flow, let the initial state send flow and every state drain it (an edge to a sink
`T`): a flow is then a bag of walks that covers every edge, and its value is their number, so
the fewest walks is the minimum flow. Computed the textbook way (Ahuja, Magnanti and Orlin,
*Network Flows*, the minimum flow problem): a feasible flow first, then the most flow that can be
sent back from the sink to the source through the residual network (networkx's maximum flow,
preflow-push), which is exactly what the feasible flow carries beyond the minimum.

On a DAG every path from the initial state can be prolonged to a state with no way out, so the
bound does not depend on where walks stop. It holds for any planner that starts every walk at
the initial state; a planner that restores saved states at branch points is not bound by it.
"""

from __future__ import annotations

from collections.abc import Hashable

import networkx as nx
from networkx.algorithms.flow import preflow_push

SINK = ("walk_bound", "sink")
"""The sink node of the flow network (a tuple no state id can equal)."""


class CycleError(ValueError):
    """The graph has a cycle: walks could go round it forever, and neither the bound nor the
    planner is defined there."""


def require_acyclic(graph: nx.DiGraph, label: str = "action") -> None:
    """Raise `CycleError` naming one cycle (with its edge labels) if `graph` has any."""
    if nx.is_directed_acyclic_graph(graph):
        return
    cycle = nx.find_cycle(graph)
    steps = " -> ".join(f"{u} -[{graph.edges[u, v].get(label, '?')}]" for u, v, *_ in cycle)
    raise CycleError(f"the state graph has a cycle: {steps} -> {cycle[0][0]}; walks are planned "
                     "on a DAG (every action makes progress), so a model change made some action "
                     "undo another: find it and make it progress, or bound it")


def walks_lower_bound(graph: nx.DiGraph, root: Hashable = 0) -> int:
    """The fewest walks from `root` that together walk every edge of the DAG `graph`.

    Every node must be reachable from `root` (as in an exploration's graph).
    """
    require_acyclic(graph)
    if graph.number_of_edges() == 0:
        return 0
    flow, drained = _feasible_flow(graph)
    value = sum(flow[root, w] for w in graph.successors(root))
    # The residual network for sending flow back from the sink: along an edge's reverse, down to
    # its lower bound of one; into a state, what it drained; along an edge, without limit.
    residual = nx.DiGraph()
    unlimited = value  # no path can carry more than the whole flow
    residual.add_edges_from(graph.edges(), capacity=unlimited)
    residual.add_edges_from(((v, u, {"capacity": f - 1}) for (u, v), f in flow.items() if f > 1))
    residual.add_edges_from((SINK, v, {"capacity": x}) for v, x in drained.items() if x > 0)
    if SINK not in residual:
        return value
    back = nx.maximum_flow_value(residual, SINK, root, flow_func=preflow_push)
    return int(value - back)


def _feasible_flow(graph: nx.DiGraph) -> tuple[dict[tuple[Hashable, Hashable], int],
                                                dict[Hashable, int]]:
    """A flow meeting every lower bound: each state, latest first, takes in what it sends on
    (at least one unit per incoming edge), the surplus on its first incoming edge; what it takes
    in beyond what it sends on, it drains to the sink."""
    flow: dict[tuple[Hashable, Hashable], int] = {}
    drained: dict[Hashable, int] = {}
    for v in reversed(list(nx.topological_sort(graph))):
        out = sum(flow[v, w] for w in graph.successors(v))
        preds = list(graph.predecessors(v))
        if not preds:
            continue
        need = max(out, len(preds))
        drained[v] = need - out
        for i, u in enumerate(preds):
            flow[u, v] = 1 + (need - len(preds) if i == 0 else 0)
    return flow, drained

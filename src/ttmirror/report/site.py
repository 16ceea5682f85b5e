"""The review report: one static site a spec reviewer opens in a browser (`ttmirror report`).

Everything it shows is computed here, in this run, from the model, the manifest and the files it
is given: the verdicts are `ttmirror check --json`'s, the graphs are the `graph` views drawn by
Graphviz, the counterexamples are the explorer's shortest paths, the coverage is the guided
walks' (run here, on the emulated device), the kill matrix is a `ttmirror mutants --json` file
and the step tables are the regression traces. The site is self-contained: `index.html`, its
script and its style sheet, no network at view time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ttmirror.model.actions import in_flight
from ttmirror.model.explore import Exploration
from ttmirror.model.invariants import INVARIANTS, SOMETIMES
from ttmirror.model.state import Bounds, State, validate_bounds
from ttmirror.report import check as report
from ttmirror.report.render import to_svg
from ttmirror.report.views import View, project, request_phase, slot_phase
from ttmirror.resources import MANIFEST, SPEC
from ttmirror.resources import REVIEW_ASSETS as ASSETS

WALKED, UNWALKED = "#1e8449", "#b3b6b7"

GRAPH_PROPERTY_TEXT = {
    "NoDeadlock": "Every state that is not final has an enabled action: the system never gets "
                  "stuck.",
    "CanAlwaysFinish": "From every reachable state some path reaches a final state (every "
                       "request closed, nothing in flight, every written slot released).",
}
VOCABULARY = (
    ("allocate", "allocate", "the ring of device slots is allocated at load, before any trace "
                             "capture"),
    ("write", "launch", "the step's forward and sampler run; the sampler writes its tokens into "
                        "the step's slot"),
    ("combine", "combine", "the next step's input ids are built on the device, a row from the "
                           "previous step's slot (the mirror) or from the host's ids"),
    ("readback", "readback_issue, readback_complete", "the slot is copied to the host without "
                                                       "blocking, under an event"),
    ("release", "release", "the slot is handed back once every reader (its readback and the "
                           "next combine) is done"),
    ("stale", "-", "a request's host ids are stale while its newest token is still on the "
                   "device (a step for it in flight); the view marks those states"),
)


def invariant_text(name: str) -> str:
    """What the property says, in words (the invariant's one-line docstring)."""
    for inv in INVARIANTS:
        if inv.name == name:
            return " ".join((inv.holds.__doc__ or name).split())
    return GRAPH_PROPERTY_TEXT.get(name, name)


def plain_state(s: State) -> dict[str, Any]:
    """Every variable of a model state, JSON-friendly (the state-row table only where it has
    rows)."""
    # The state-row table exists only with state rows (the ring's is always empty).
    return {k: report.plain(v) for k, v in s._asdict().items() if k != "table" or v}


# --- the views: the graphs with their nodes' states ---------------------------------------------


@dataclass
class GraphView:
    """One lifecycle view: its SVG, and per node the states it stands for."""

    key: str
    title: str
    caption: str
    svg: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Node id -> {label, states (how many), state (the first found: fewest steps), stale}."""
    walked: int = 0
    edges: int = 0


def _lifecycle(ex: Exploration, view: View, key: Callable[[State], str], name: str,
               caption: str, walked: set[tuple[int, int]] | None,
               stale: Callable[[State], bool] | None = None) -> GraphView:
    ids = {label: nid for nid, label in view.nodes.items()}
    node_of = [ids[key(s)] for s in ex.states]  # each state's box, once
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for n, nid in enumerate(node_of):
        first.setdefault(nid, n)
        count[nid] = count.get(nid, 0) + 1
    styles: dict[tuple[str, str], str] = {}
    walked_edges: set[tuple[str, str]] = set()
    if walked is not None:
        for u, v in walked:
            a, b = node_of[u], node_of[v]
            if a != b:
                walked_edges.add((a, b))
        for edge in view.edges:
            on = edge in walked_edges
            styles[edge] = (f'color="{WALKED}", penwidth=2' if on
                            else f'color="{UNWALKED}", style=dashed')
    out = GraphView(name, view.title, caption, to_svg(view, styles),
                    walked=len(walked_edges & set(view.edges)), edges=len(view.edges))
    for nid, label in view.nodes.items():
        s = ex.states[first[nid]]
        out.nodes[nid] = {"label": label, "states": count[nid], "state": plain_state(s),
                          "stale": bool(stale and stale(s))}
    return out


def slot_view(ex: Exploration, walked: set[tuple[int, int]] | None) -> GraphView:
    view = project(ex, "slot", 0)
    caption = ("Slot 0 of the ring: allocate, then each step's launch writes it (the sampler), "
               "the next step's combine and the step's readback read it, and release hands it "
               "back once both are done. Each box stands for every model state with that slot "
               "phase; click one to see the first such state found (fewest steps) in full.")
    return _lifecycle(ex, view, lambda s: slot_phase(s, 0), "slot", caption, walked)


def request_view(ex: Exploration, walked: set[tuple[int, int]] | None) -> GraphView:
    view = project(ex, "request", 0)
    # A box's label says where the newest token is, so one state of it says whether it is stale.
    out = _lifecycle(ex, view, lambda s: request_phase(s, 0), "request", "", walked,
                     stale=lambda s: in_flight(s, 0) > 0)
    stale_ids = {nid for nid, node in out.nodes.items() if node["stale"]}
    # What ends staleness: the actions on edges from a stale box to a box that is not.
    ends = sorted({name for (a, b), names in view.edges.items()
                   if a in stale_ids and b not in stale_ids for name in names})
    out.caption = ("Request 0: its status, the tokens delivered to the user, and where its "
                   "newest token is. Its host ids are stale while that token is on the device (a "
                   f"step for it in flight: {len(stale_ids)} of {len(view.nodes)} boxes, marked "
                   f"stale); what ends it here: {', '.join(ends) or 'nothing'}. Combine then "
                   "reads the mirror, never the stale host ids: that is the guard.")
    for node in out.nodes.values():
        node["ends_stale"] = ends if node["stale"] else []
    return out


# --- counterexamples, traces, kills -------------------------------------------------------------


def counterexample(name: str, about: str, ex: Exploration) -> dict[str, Any]:
    """A failing variant's shortest counterexample, every state in full, for the stepper."""
    failure = ex.failure()
    out: dict[str, Any] = {"variant": name, "about": about, "bounds": ex.bounds._asdict(),
                           "states": len(ex.states), "violated": None, "steps": []}
    cex = report.counterexample(ex)  # `check`'s steps: each action and what it changed
    if failure is None or cex is None:
        return out
    violated, steps = cex
    out["violated"] = violated
    out["violated_text"] = invariant_text(violated)
    out["steps"] = [{"action": "initial state", "state": plain_state(ex.states[0]),
                     "changed": {}}] + [
        {"action": step["action"], "state": plain_state(ex.states[target]),
         "changed": step["changes"]}
        for step, (_, target) in zip(steps, ex.path_to(failure[1]), strict=True)]
    return out


def cti_rows(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A counterexample to induction's two states side by side, one row per variable (each
    queue place, slot and request its own row), ``changed`` where the action changed it."""
    def flat(state: Mapping[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in state.items():
            if isinstance(value, list) and key in ("queue", "slots", "requests"):
                for i, item in enumerate(value):
                    out[f"{key}[{i}]"] = json.dumps(item, separators=(",", ":"))
            else:
                out[key] = json.dumps(value, separators=(",", ":"))
        return out

    b, a = flat(before), flat(after)
    return [{"name": k, "before": b.get(k, "-"), "after": a.get(k, "-"),
             "changed": b.get(k) != a.get(k)} for k in dict.fromkeys([*b, *a])]


def known_bad(bounds: Bounds) -> list[tuple[str, str, Bounds]]:
    """Each failing variant of the manifest's default size, its changes applied to `bounds`
    (those the changed bounds cannot mean, as a two-request variant at one request, left out)."""
    out = []
    for entry in json.loads(MANIFEST.read_text())["models"]:
        if entry["size"] == "default" and entry["violated"]:
            bad = bounds._replace(**entry["bounds"])
            try:
                validate_bounds(bad)
            except ValueError:
                continue
            out.append((entry["name"], entry["about"], bad))
    return out


def trace_table(path: Path) -> dict[str, Any]:
    """An ITF regression trace as a step table: action and changed variables per state."""
    try:
        data = json.loads(path.read_text())
        states = data["states"]
        meta = data.get("#meta", {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"name": path.name, "error": f"unreadable: {e}"}
    rows = []
    before: dict[str, Any] = {}
    for i, st in enumerate(states):
        values = {k: v for k, v in st.items() if not k.startswith(("#", "mbt::"))}
        changed = sorted(k for k, v in values.items() if before.get(k) != v) if i else []
        rows.append({"index": i, "action": st.get("mbt::actionTaken", ""),
                     "changed": changed})
        before = values
    tt = meta.get("ttmirror", {})
    return {"name": path.name, "description": meta.get("description", ""),
            "bug": tt.get("bug"), "failure": tt.get("failure"), "rows": rows}


def kills(path: Path | None) -> dict[str, Any]:
    """The kill matrix from a `ttmirror mutants --json` file, or why there is none."""
    if path is None:
        return {"rows": None, "note": "not in this report: write one with `ttmirror mutants "
                                      "--json > kills.json` and pass `--mutants kills.json`"}
    try:
        rows = json.loads(path.read_text())
        assert isinstance(rows, list) and all(isinstance(r, dict) and "id" in r for r in rows)
    except (OSError, ValueError, AssertionError) as e:
        raise ValueError(f"--mutants {path}: not a `ttmirror mutants --json` file ({e})") from None
    killed = sum(1 for r in rows if r.get("killed"))
    return {"rows": rows, "note": f"{killed} of {len(rows)} planted bugs killed ({path.name})"}


def bench_engine(path: Path | None) -> dict[str, Any] | None:
    """`make bench-engine`'s figures (`--json`), checked; None when not given."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        points = data["points"]
        for p in points:
            for key in ("ratio", "measured_ratio", "speedup", "ideal"):
                float(p[key])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--bench-engine {path}: not a `bench_engine.py --json` file "
                         f"({e})") from None
    return dict(data)


def plot_geometry(points: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Where `plot.svg` draws depth-2 over depth-1 speedup and its ideal against the measured d/h
    (log scale): the frame, each line's points and the ticks, in SVG coordinates."""
    import math

    width, height, pad = 560, 300, 48
    xs = [math.log2(float(p["measured_ratio"])) for p in points]
    ys = [float(v) for p in points for v in (p["speedup"], p["ideal"])]
    x0, x1 = min(xs) - 0.3, max(xs) + 0.3
    y0, y1 = min(0.8, *ys), max(2.1, *ys)

    def at(x: float, y: float) -> tuple[float, float]:
        return (pad + (x - x0) / (x1 - x0) * (width - 2 * pad),
                height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad))

    lines = [{"colour": colour, "dash": dash,
              "points": [at(x, float(p[key])) for x, p in zip(xs, points, strict=True)]}
             for key, colour, dash in (("ideal", "#7f8c8d", "5,4"), ("speedup", "#1f618d", ""))]
    return {
        "width": width, "height": height, "pad": pad, "lines": lines,
        "xticks": [{"x": at(x, y0)[0], "value": float(p["measured_ratio"])}
                   for x, p in zip(xs, points, strict=True)],
        "yticks": [{"y": at(x0, v)[1], "value": v} for v in (1.0, 1.5, 2.0) if y0 <= v <= y1],
    }


def _bench_rows(data: Mapping[str, Any]) -> list[dict[str, float]]:
    return [{"ratio": float(p["ratio"]), "measured_ratio": float(p["measured_ratio"]),
             "speedup": float(p["speedup"]), "ideal": float(p["ideal"]),
             "share": float(p["speedup"]) / float(p["ideal"]),
             "overlapped": float(p.get("overlapped", 0)),
             "overlapped_drain": float(p.get("overlapped_drain", 0))} for p in data["points"]]


# --- the page -----------------------------------------------------------------------------------


def spec_html() -> str:
    """The design spec rendered from its Markdown (Python-Markdown, tables and a table of
    contents)."""
    import markdown

    return markdown.markdown(SPEC.read_text(), extensions=["tables", "fenced_code", "toc"],
                             extension_configs={"toc": {"permalink": False}})


def failures(check: Mapping[str, Any]) -> str:
    """What a `check --json` object says failed, in one line: the violated properties and the
    applicable "sometimes" checks not reached ("" when it passed)."""
    violated = [name for name, verdict in check["invariants"].items() if verdict != "ok"]
    unreached = [name for name, hit in check["sometimes"].items() if not hit]
    parts = [f"violated: {', '.join(violated)}"] if violated else []
    parts += [f"not reached: {', '.join(unreached)}"] if unreached else []
    return "; ".join(parts)


def _sometimes_text(name: str) -> str:
    for c in SOMETIMES:
        if c.name == name:
            return " ".join((c.reached.__doc__ or name).split())
    return name


TEMPLATES = Environment(
    loader=PackageLoader("ttmirror.report", "templates"),
    autoescape=select_autoescape(("html", "svg")),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
)
"""The site's templates (`ttmirror/report/templates/`), escaping every value they are given."""


def page(data: Mapping[str, Any]) -> str:
    """index.html: every section, and the data the script needs (states, counterexamples)."""
    views = data["views"]
    script_data = {
        "views": {g.key: g.nodes for g in views},
        "counterexamples": data["counterexamples"],
    }
    nav = [("verdicts", "Verdicts"), ("proof", "Proof"),
           *((f"view-{g.key}", g.title) for g in views),
           ("counterexamples", "Counterexamples"), ("coverage", "Coverage"), ("kills", "Kills"),
           ("traces", "Traces"), ("bench", "Benchmarks"), ("vocabulary", "Vocabulary"),
           ("spec", "Spec")]
    bench = data.get("bench")
    return TEMPLATES.get_template("index.html").render(
        check=data["check"], check_json=json.dumps(data["check"], indent=1), tlc=data["tlc"],
        proof=data.get("proof"),
        views=[_with_svg(g) for g in views], coverage=data["coverage"],
        cexs=data["counterexamples"], kills=data["kills"], traces=data["traces"],
        bench=None if bench is None else {"data": bench, "rows": _bench_rows(bench)},
        plot=None if bench is None else plot_geometry(bench["points"]),
        nav=nav, vocabulary=VOCABULARY, spec=Markup(data["spec"]),
        # "</" closes a script element wherever it appears: escape it inside the JSON.
        payload=Markup(json.dumps(script_data).replace("</", "<\\/")),
        invariant_text=invariant_text, sometimes_text=_sometimes_text, failures=failures,
        cti_rows=cti_rows,
    )


def _with_svg(g: GraphView) -> GraphView:
    """`g` with its SVG marked as markup: Graphviz wrote it in this run, from our labels (which
    Graphviz itself escapes)."""
    return GraphView(g.key, g.title, g.caption, Markup(g.svg), g.nodes, g.walked, g.edges)


def write(data: Mapping[str, Any], out: Path) -> Path:
    """Write the site into `out`; returns index.html's path."""
    out.mkdir(parents=True, exist_ok=True)
    for asset in ("review.js", "review.css"):
        shutil.copyfile(ASSETS / asset, out / asset)
    index = out / "index.html"
    index.write_text(page(data))
    return index

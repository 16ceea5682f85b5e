"""The review report: one static site a spec reviewer opens in a browser (`ttmirror report`).

Everything it shows is computed here, in this run, from the model, the manifest and the files it
is given: the verdicts are `ttmirror check --json`'s, the graphs are the `graph` views drawn by
Graphviz, the counterexamples are the explorer's shortest paths, the coverage is the guided
walks' (run here, on the emulated device), the kill matrix is a `ttmirror mutants --json` file
and the step tables are the regression traces. The site is self-contained: `index.html`, its
script and its style sheet, no network at view time.
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import report
from .manifest import PATH as MANIFEST
from .model.actions import in_flight
from .model.explore import Exploration
from .model.invariants import INVARIANTS, SOMETIMES
from .model.state import Bounds, State
from .render import to_svg
from .resources import REVIEW_ASSETS as ASSETS
from .resources import SPEC
from .views import View, project, request_phase, slot_phase

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
    """Every variable of a model state, JSON-friendly."""
    return {k: report.plain(v) for k, v in s._asdict().items()}


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


def known_bad(bounds: Bounds) -> list[tuple[str, str, Bounds]]:
    """Each failing variant of the manifest's default size, its changes applied to `bounds`."""
    out = []
    for entry in json.loads(MANIFEST.read_text())["models"]:
        if entry["size"] == "default" and entry["violated"]:
            out.append((entry["name"], entry["about"], bounds._replace(**entry["bounds"])))
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


def speedup_plot(points: list[Mapping[str, Any]]) -> str:
    """An SVG plot: depth-2 over depth-1 speedup and its ideal, against the measured d/h (log)."""
    import math

    width, height, pad = 560, 300, 48
    xs = [math.log2(float(p["measured_ratio"])) for p in points]
    ys = [float(v) for p in points for v in (p["speedup"], p["ideal"])]
    x0, x1 = min(xs) - 0.3, max(xs) + 0.3
    y0, y1 = min(0.8, *ys), max(2.1, *ys)

    def at(x: float, y: float) -> str:
        px = pad + (x - x0) / (x1 - x0) * (width - 2 * pad)
        py = height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)
        return f"{px:.1f},{py:.1f}"

    def line(key: str, colour: str, dash: str) -> str:
        pts = " ".join(at(x, float(p[key])) for x, p in zip(xs, points, strict=True))
        marks = "".join(f'<circle cx="{at(x, float(p[key])).split(",")[0]}" '
                        f'cy="{at(x, float(p[key])).split(",")[1]}" r="3.5" fill="{colour}"/>'
                        for x, p in zip(xs, points, strict=True))
        return (f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2" '
                f'stroke-dasharray="{dash}"/>{marks}')

    ticks = "".join(
        f'<text x="{at(x, y0).split(",")[0]}" y="{height - pad + 16}" text-anchor="middle">'
        f'{float(p["measured_ratio"]):.2g}</text>' for x, p in zip(xs, points, strict=True))
    yticks = "".join(
        f'<text x="{pad - 6}" y="{float(at(x0, v).split(",")[1]) + 4:.1f}" text-anchor="end">'
        f'{v:g}x</text><line x1="{pad}" x2="{width - pad}" y1="{at(x0, v).split(",")[1]}" '
        f'y2="{at(x0, v).split(",")[1]}" stroke="#eaeded"/>'
        for v in (1.0, 1.5, 2.0) if y0 <= v <= y1)
    return (f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" font-size="11" font-family="sans-serif" role="img" '
            f'aria-label="speedup against the ideal">{yticks}'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
            f'stroke="#566573"/>{ticks}'
            f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">measured d/h '
            "(log scale)</text>"
            f'{line("ideal", "#7f8c8d", "5,4")}{line("speedup", "#1f618d", "")}'
            f'<text x="{width - pad}" y="{pad - 18}" text-anchor="end" fill="#1f618d">'
            "measured depth 2 / depth 1</text>"
            f'<text x="{width - pad}" y="{pad - 4}" text-anchor="end" fill="#7f8c8d">'
            "ideal (h+d)/max(h,d)</text></svg>")


def _bench(data: Mapping[str, Any] | None) -> str:
    if data is None:
        return ('<section id="bench"><h2>Benchmarks</h2><p>Not in this report: run <code>make '
                "bench-engine</code> (it writes <code>out/bench-engine.json</code>), then "
                "<code>ttmirror report --bench-engine out/bench-engine.json</code>.</p></section>")
    rows = "".join(
        f"<tr><td>{float(p['ratio']):g}</td><td>{float(p['measured_ratio']):.2f}</td>"
        f"<td>{float(p['speedup']):.2f}x</td><td>{float(p['ideal']):.2f}x</td>"
        f"<td>{float(p['speedup']) / float(p['ideal']):.0%}</td>"
        f"<td>{float(p.get('overlapped', 0)):.1%}</td>"
        f"<td>{float(p.get('overlapped_drain', 0)):.1%}</td></tr>" for p in data["points"])
    return f"""<section id="bench"><h2>Benchmarks</h2>
<p>Serving tokens/s at depth 2 over depth 1 on the emulated device (<code>make bench-engine</code>,
median of {data.get('rounds', '?')} rounds per point), beside the ideal (h+d)/max(h,d). Where the
host is the bottleneck, the emulated kernels' Python shares the host's GIL and depth 2 cannot
reach the ideal (the benchmark prints by how much).</p>
{speedup_plot(data['points'])}
<table><tr><th>d/h asked</th><th>d/h measured</th><th>speedup</th><th>ideal</th>
<th>share</th><th>overlapped under churn</th><th>with the drain policy</th></tr>{rows}</table>
</section>"""


# --- the page -----------------------------------------------------------------------------------


def spec_html() -> str:
    """The design spec rendered from its Markdown (Python-Markdown, tables and a table of
    contents)."""
    import markdown

    return markdown.markdown(SPEC.read_text(), extensions=["tables", "fenced_code", "toc"],
                             extension_configs={"toc": {"permalink": False}})


def _e(text: object) -> str:
    return html.escape(str(text))


def _verdicts(check: Mapping[str, Any], tlc: Mapping[str, Any] | None) -> str:
    rows = []
    for name, verdict in check["invariants"].items():
        cls = "ok" if verdict == "ok" else "bad"
        rows.append(f'<tr class="{cls}"><td>{_e(name)}</td><td data-verdict="{_e(name)}">'
                    f'{_e(verdict)}</td><td>{_e(invariant_text(name))}</td></tr>')
    sometimes = "".join(
        f'<tr class="{"ok" if hit else "bad"}"><td>{_e(name)}</td><td>'
        f'{"reached" if hit else "NOT reached"}</td><td>{_e(_sometimes_text(name))}</td></tr>'
        for name, hit in check["sometimes"].items())
    if tlc is None:
        tlc_line = "<p>TLC: not run (no Java here, or <code>--no-tlc</code>).</p>"
    else:
        tlc_line = (f'<p id="tlc">TLC: {tlc["tlc_states"]:,} states, verdicts '
                    f'{"agree" if tlc["agree"] else "DISAGREE"} with the explorer'
                    + ("" if tlc.get("guard_off") is None else
                       f'; guard off: {"agree" if tlc["guard_off"]["agree"] else "DISAGREE"}')
                    + ".</p>")
    b = check["params"]
    bounds = ", ".join(f"{k} {v}" for k, v in b.items())
    return f"""
<section id="verdicts"><h2>Verdicts</h2>
<p>Bounds: {_e(bounds)}. <span class="{'ok' if check['passed'] else 'bad'}" id="passed">
{'PASS: every property holds and every situation was reached' if check['passed'] else 'FAIL'}
</span></p>
<table class="figures"><tr><th>states</th><th>transitions</th><th>deadlocks</th>
<th>states that cannot finish</th><th>final states</th></tr>
<tr><td data-figure="states">{check['states']:,}</td>
<td data-figure="transitions">{check['transitions']:,}</td>
<td data-figure="deadlocks">{check['deadlocks']}</td>
<td data-figure="cannot_finish">{check['cannot_finish']}</td>
<td data-figure="final_states">{check['final_states']:,}</td></tr></table>
<h3>Invariants and graph properties</h3>
<table><tr><th>property</th><th>verdict</th><th>what it says</th></tr>{''.join(rows)}</table>
<h3>"Sometimes": the situation really occurred</h3>
<table><tr><th>check</th><th>reached</th><th>what it means</th></tr>{sometimes}</table>
{tlc_line}
<details><summary><code>ttmirror check --json</code>, as printed</summary>
<pre id="check-json">{_e(json.dumps(check, indent=1))}</pre></details>
</section>"""


def _sometimes_text(name: str) -> str:
    for c in SOMETIMES:
        if c.name == name:
            return " ".join((c.reached.__doc__ or name).split())
    return name


def _graph(g: GraphView, coverage: Mapping[str, Any] | None) -> str:
    walked = ""
    if coverage is not None:
        walked = (f'<p class="coverage">Edges of this view walked by the fuzz: '
                  f'<span data-walked="{g.key}">{g.walked} of {g.edges}</span> (green: '
                  f'walked; grey dashed: not walked).</p>')
    return f"""
<section id="view-{g.key}" class="view"><h2>{_e(g.title)}</h2><p>{_e(g.caption)}</p>{walked}
<div class="graph-wrap"><div class="zoom">
<button type="button" data-zoom="in">+</button><button type="button" data-zoom="out">&minus;
</button><button type="button" data-zoom="reset">fit</button></div>
<div class="graph" data-view="{g.key}">{g.svg}</div>
<aside class="state-panel" id="state-{g.key}"><p>Click a state in the graph.</p></aside></div>
</section>"""


def _counterexamples(cexs: list[dict[str, Any]]) -> str:
    items = []
    for i, c in enumerate(cexs):
        if c["violated"] is None:
            items.append(f'<div class="cex"><h3>{_e(c["variant"])}</h3><p>{_e(c["about"])}: '
                         "every property holds at these bounds.</p></div>")
            continue
        items.append(f"""<div class="cex" id="cex-{i}" data-cex="{i}">
<h3>{_e(c['variant'])}: {_e(c['violated'])} in {len(c['steps']) - 1} steps</h3>
<p>{_e(c['about'])} ({c['states']:,} states explored).</p>
<div class="stepper"><button type="button" data-step="first">&laquo;</button>
<button type="button" data-step="prev">previous</button><span class="where"></span>
<button type="button" data-step="next">next</button>
<button type="button" data-step="last">&raquo;</button></div>
<div class="step-action"></div><table class="state"></table><div class="verdict"></div></div>""")
    return ('<section id="counterexamples"><h2>Known-bad variants: shortest counterexamples'
            "</h2><p>Each variant of the manifest that must fail, on these bounds; step through "
            "its shortest path: the variables the action changed are highlighted, and the last "
            "step names the property it breaks.</p>" + "".join(items) + "</section>")


def _coverage(cov: Mapping[str, Any] | None) -> str:
    if cov is None:
        return ('<section id="coverage"><h2>Fuzz coverage</h2><p>Not run '
                "(<code>--fuzz-seconds 0</code>).</p></section>")
    failed = "" if not cov.get("failure") else (
        f'<p class="bad">A walk FAILED: {_e(cov["failure"])}</p>')
    return f"""<section id="coverage"><h2>Fuzz coverage</h2>
<p>Guided walks on the emulated TT device (seed {cov['seed']}, {cov['seconds']} s, stopped:
{_e(cov['stopped'])}): <span data-figure="edges_covered">{cov['edges_covered']:.4f}</span> of the
{cov['total_edges']:,} edges of the state graph walked and checked in lockstep
({cov['walked_edges']:,} edges, {cov['walks']:,} walks); actions covered
{cov['actions_covered']:.3f}. The lifecycle views above colour the edges walked.</p>{failed}
</section>"""


def _kills(k: Mapping[str, Any]) -> str:
    if not k["rows"]:
        return f'<section id="kills"><h2>Kill matrix</h2><p>{_e(k["note"])}.</p></section>'
    head = ("<tr><th>planted bug</th><th>config</th><th>killed</th><th>by</th><th>layer</th>"
            "<th>examples / walks</th><th>seconds</th><th>trace length</th></tr>")
    rows = "".join(
        f'<tr class="{"ok" if r.get("killed") else "bad"}"><td>{_e(r["id"])}</td>'
        f'<td>{_e(r.get("config", ""))}</td><td>{"yes" if r.get("killed") else "SURVIVED"}</td>'
        f'<td>{_e(r.get("by") or "-")}</td><td>{_e(r.get("layer") or "-")}</td>'
        f'<td>{_e(r.get("examples") if r.get("examples") is not None else "-")}</td>'
        f'<td>{_e(r.get("seconds") if r.get("seconds") is not None else "-")}</td>'
        f'<td>{_e(r.get("trace_len") if r.get("trace_len") is not None else "-")}</td></tr>'
        for r in k["rows"])
    return (f'<section id="kills"><h2>Kill matrix</h2><p>{_e(k["note"])}.</p>'
            f"<table>{head}{rows}</table></section>")


def _traces(traces: list[dict[str, Any]]) -> str:
    parts = []
    for t in traces:
        if "error" in t:
            parts.append(f"<details><summary>{_e(t['name'])}: {_e(t['error'])}</summary>"
                         "</details>")
            continue
        rows = "".join(f"<tr><td>{r['index']}</td><td>{_e(r['action'])}</td>"
                       f"<td>{_e(', '.join(r['changed']))}</td></tr>" for r in t["rows"])
        failure = t.get("failure") or {}
        parts.append(f"<details><summary>{_e(t['name'])}: {_e(t['description'])}</summary>"
                     f"<p>Planted bug: {_e(t.get('bug') or 'none')}; failure: "
                     f"{_e(failure.get('message', '-'))}</p><table><tr><th>state</th>"
                     f"<th>action</th><th>variables changed</th></tr>{rows}</table></details>")
    return ('<section id="traces"><h2>Regression traces</h2><p>Each ITF trace a regression '
            "test replays, as a step table.</p>" + "".join(parts) + "</section>")


def page(data: Mapping[str, Any]) -> str:
    """index.html: every section, and the data the script needs (states, counterexamples)."""
    views = data["views"]
    script_data = {
        "views": {g.key: g.nodes for g in views},
        "counterexamples": data["counterexamples"],
    }
    nav = "".join(f'<a href="#{anchor}">{_e(text)}</a>' for anchor, text in (
        ("verdicts", "Verdicts"), *((f"view-{g.key}", g.title) for g in views),
        ("counterexamples", "Counterexamples"), ("coverage", "Coverage"), ("kills", "Kills"),
        ("traces", "Traces"), ("bench", "Benchmarks"), ("vocabulary", "Vocabulary"),
        ("spec", "Spec")))
    vocab = "".join(f"<tr><td>{_e(w)}</td><td><code>{_e(a)}</code></td><td>{_e(t)}</td></tr>"
                    for w, a, t in VOCABULARY)
    # "</" closes a script element wherever it appears: escape it inside the JSON.
    payload = json.dumps(script_data).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>ttmirror review: mirrored sampled ids</title>
<link rel="stylesheet" href="review.css"></head>
<body><header><h1>ttmirror review: mirrored sampled ids</h1><nav>{nav}</nav></header><main>
{_verdicts(data['check'], data['tlc'])}
{''.join(_graph(g, data['coverage']) for g in views)}
{_counterexamples(data['counterexamples'])}
{_coverage(data['coverage'])}
{_kills(data['kills'])}
{_traces(data['traces'])}
{_bench(data.get('bench'))}
<section id="vocabulary"><h2>Vocabulary</h2><table><tr><th>word</th><th>model action</th>
<th>meaning</th></tr>{vocab}</table></section>
<section id="spec"><h2>Design spec</h2><div class="spec">{data['spec']}</div></section>
</main>
<footer>Written by <code>ttmirror report</code>; every figure computed in that run.</footer>
<script type="application/json" id="review-data">{payload}</script>
<script src="review.js"></script></body></html>
"""


def write(data: Mapping[str, Any], out: Path) -> Path:
    """Write the site into `out`; returns index.html's path."""
    out.mkdir(parents=True, exist_ok=True)
    for asset in ("review.js", "review.css"):
        shutil.copyfile(ASSETS / asset, out / asset)
    index = out / "index.html"
    index.write_text(page(data))
    return index

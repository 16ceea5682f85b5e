"""Render a View as Graphviz DOT, SVG (through Graphviz's ``dot``), Mermaid or JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping

from ttmirror.report.views import View

FORMATS = ("dot", "mermaid", "svg", "json")
BAD = "#c0392b"


def to_dot(view: View, styles: Mapping[tuple[str, str], str] | None = None) -> str:
    """Graphviz DOT with a legend; the counterexample path in red; `styles` adds edge attributes
    (the report colours the edges the fuzz walked)."""
    lines = [
        "digraph ttmirror {",
        f'  label="{_esc(view.title)}"; labelloc=t; fontname="Helvetica";',
        '  node [shape=box, style="rounded,filled", fillcolor="#f7f7f7", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
        '  start [shape=point, width=0.15, label=""];',
    ]
    on_path = set(view.path_nodes)
    for nid, label in view.nodes.items():
        extra = f', color="{BAD}", fillcolor="#fdecea", penwidth=2' if nid in on_path else ""
        lines.append(f'  {nid} [label="{_esc(label)}"{extra}];')
    if view.initial:
        lines.append(f"  start -> {view.initial};")
    for (a, b), names in sorted(view.edges.items()):
        on = (a, b) in view.path_edges
        style = f', color="{BAD}", fontcolor="{BAD}", penwidth=2' if on else ""
        if styles and (a, b) in styles:
            style += ", " + styles[(a, b)]
        lines.append(f'  {a} -> {b} [label="{_esc(", ".join(sorted(names)))}"{style}];')
    legend = "red: shortest counterexample to " + view.violation if view.violation else (
        "edges: actions that change this view; every invariant holds"
    )
    lines.append(f'  legend [shape=note, fillcolor="#ffffff", label="{_esc(legend)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(view: View) -> str:
    """Mermaid stateDiagram-v2, which renders in code review on common forges."""
    lines = ["stateDiagram-v2", f"    %% {view.title}"]
    for nid, label in view.nodes.items():
        lines.append(f"    {nid} : {_mermaid_text(label)}")
    if view.initial:
        lines.append(f"    [*] --> {view.initial}")
    for (a, b), names in sorted(view.edges.items()):
        text = _mermaid_text(", ".join(sorted(names)))
        if (a, b) in view.path_edges:
            text = "⚠ " + text
        lines.append(f"    {a} --> {b} : {text}")
    if view.path_nodes:
        lines.append(f"    classDef counterexample fill:#fdecea,stroke:{BAD},stroke-width:2px")
        lines.append(f"    class {','.join(dict.fromkeys(view.path_nodes))} counterexample")
        lines.append(f"    %% ⚠ marks the shortest counterexample to {view.violation}")
    return "\n".join(lines) + "\n"


def to_json(view: View) -> str:
    """Nodes, edges and the counterexample path as one JSON object."""
    return json.dumps(
        {
            "title": view.title,
            "initial": view.initial,
            "nodes": [{"id": n, "label": label} for n, label in view.nodes.items()],
            "edges": [
                {"source": a, "target": b, "actions": sorted(names),
                 "counterexample": (a, b) in view.path_edges}
                for (a, b), names in sorted(view.edges.items())
            ],
            "violation": view.violation,
            "counterexample_path": view.path_nodes,
        },
        indent=1,
    ) + "\n"


def to_svg(view: View, styles: Mapping[tuple[str, str], str] | None = None) -> str:
    """SVG drawn by Graphviz's ``dot`` (with `to_dot`'s edge `styles`)."""
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError("Graphviz 'dot' not found: install Debian's graphviz package")
    done = subprocess.run(
        [dot, "-Tsvg"], input=to_dot(view, styles), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def render(view: View, fmt: str) -> str:
    """The view in ``fmt`` (one of FORMATS)."""
    return {"dot": to_dot, "mermaid": to_mermaid, "svg": to_svg, "json": to_json}[fmt](view)


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mermaid_text(text: str) -> str:
    # Mermaid labels end at a newline and treat ':' and ';' specially.
    return text.replace("\n", " · ").replace(":", " =").replace(";", ",")

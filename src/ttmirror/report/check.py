"""What `ttmirror check` says: the JSON object and the human report of an exploration."""

from __future__ import annotations

from typing import Any

from ttmirror.model.explore import Exploration, changes, verdicts
from ttmirror.model.invariants import SOMETIMES
from ttmirror.model.state import state_row_count


def counterexample(ex: Exploration) -> tuple[str, list[dict[str, Any]]] | None:
    """The violated property and its shortest path as [{"action", "changes"}]."""
    failure = ex.failure()
    if failure is None:
        return None
    name, node = failure
    steps = []
    prev = 0
    for action, target in ex.path_to(node):
        delta = changes(ex.states[prev], ex.states[target])
        steps.append({"action": action.label(),
                      "changes": {k: plain(v) for k, v in delta.items()}})
        prev = target
    return name, steps


def unreached(ex: Exploration) -> list[str]:
    """Applicable "sometimes" checks the search never reached: a vacuity warning."""
    return [name for name, hit in ex.sometimes.items() if not hit]


def passed(ex: Exploration) -> bool:
    """Every property holds and every applicable "sometimes" check was reached."""
    return ex.ok and not unreached(ex)


def as_json(ex: Exploration) -> dict[str, Any]:
    """The machine-readable report."""
    cex = counterexample(ex)
    return {
        "params": ex.bounds._asdict(),
        "states": len(ex.states),
        "transitions": ex.transitions,
        "seconds": round(ex.seconds, 3),
        "states_per_second": round(len(ex.states) / ex.seconds) if ex.seconds else None,
        "invariants": verdicts(ex),
        "sometimes": dict(ex.sometimes),
        "sometimes_not_applicable": [
            c.name for c in SOMETIMES if c.name not in ex.sometimes
        ],
        "deadlocks": len(ex.deadlocks),
        "cannot_finish": len(ex.cannot_finish),
        "final_states": len(ex.finals),
        "violated": cex[0] if cex else None,
        "counterexample": cex[1] if cex else None,
        "passed": passed(ex),
    }


def as_text(ex: Exploration) -> str:
    """The human report: sizes, each property, each sometimes check, the counterexample."""
    b = ex.bounds
    lines = [
        f"bounds: depth {b.depth}, slots {b.slots}, requests {b.requests}, "
        f"max tokens {b.max_tokens}, preemptions {b.preemptions}; "
        f"finish {_on(b.finish)}, abort {_on(b.abort)}, preempt {_on(b.preempt)}, "
        f"condense {_on(b.condense)}; guard {_on(b.guard)}, release at {b.release_at}"
        + (f"; spec tokens {b.spec_tokens}" if b.spec_tokens else "")
        + (f"; state rows ({state_row_count(b)})" if b.state == "rows" else "; state ring")
        + f", subsets {_on(b.subsets)}",
        f"explored {len(ex.states):,} states, {ex.transitions:,} transitions in {ex.seconds:.2f} s"
        f" ({len(ex.states) / max(ex.seconds, 1e-9):,.0f} states/s)",
        "",
        "invariants:",
    ]
    for name, verdict in verdicts(ex).items():
        lines.append(f"  {'ok      ' if verdict == 'ok' else 'VIOLATED'}  {name}")
    lines.append("sometimes (the situation really occurred):")
    for name, hit in ex.sometimes.items():
        lines.append(f"  {'reached ' if hit else 'NOT YET '}  {name}")
    skipped = [c.name for c in SOMETIMES if c.name not in ex.sometimes]
    if skipped:
        lines.append(f"  (not applicable at these bounds: {', '.join(skipped)})")
    lines.append(f"deadlocks: {len(ex.deadlocks)}; states that cannot finish: "
                 f"{len(ex.cannot_finish)}")
    cex = counterexample(ex)
    if cex is not None:
        name, steps = cex
        lines += ["", f"shortest counterexample to {name} ({len(steps)} steps):"]
        width = max(len(s["action"]) for s in steps)
        for i, step in enumerate(steps, start=1):
            delta = "; ".join(f"{k} = {_brief(v)}" for k, v in step["changes"].items())
            lines.append(f"  {i:>2}  {step['action']:<{width}}  {delta}")
    lines.append("")
    if passed(ex):
        lines.append("PASS: every invariant holds and every situation was reached")
    elif ex.ok:
        lines.append("FAIL: vacuous, not reached: " + ", ".join(unreached(ex)))
    else:
        lines.append(f"FAIL: {cex[0] if cex else 'violation'}")
    return "\n".join(lines)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def plain(value: Any) -> Any:
    """JSON-friendly: enums by name, named tuples as objects, tuples as lists."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if hasattr(value, "name") and hasattr(value, "value"):
        return value.name
    if isinstance(value, tuple | list | frozenset | set):
        items = sorted(value) if isinstance(value, frozenset | set) else value
        return [plain(v) for v in items]
    return value


def _brief(value: Any) -> str:
    text = str(plain(value))
    return text if len(text) <= 70 else text[:67] + "..."

"""Regression traces in the Informal Trace Format (ITF), the JSON of Apalache and Quint.

A trace holds the model state after every move, and the move itself in Quint's model-based
testing variables (``mbt::actionTaken``, ``mbt::nondetPicks``): model actions, device
completions (``device`` with the queue it advanced) and refusals (``refuse`` with the disabled
action the implementation had to reject). ``#meta.ttmirror`` says what to rebuild: bounds,
backend, prompts, the planted bug that was on, the seed, and the failure.

Values follow ITF: tuples ``{"#tup": [...]}``, sets ``{"#set": [...]}``, records as objects,
enums by name, optional fields as the variants ``None`` / ``Some``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from ..model.actions import Action
from ..model.state import Bounds, State, initial_state
from .configs import CONFIGS
from .lockstep import EFFECT, Divergence, Move

MODEL = "mirrored-sampled-ids"
VERSION = 2
"""2: rows carry `partial`, requests `prefill_left`, bounds the preemption policy, chunking and
host sync; a version-1 trace is refused with its version."""
VARS = ["allocated", "next_slot", "queue", "slots", "requests", "broken",
        "mbt::actionTaken", "mbt::nondetPicks"]


_VALIDATION = ("max_tokens_of", "host_sync_of", "chunk_per_step")
"""Bounds only a validated serving run sets; left out of a trace where they are unset."""


class TraceError(ValueError):
    """The file is not a ttmirror ITF trace for this model."""


def encode(value: Any, optional: bool = False) -> Any:
    """An ITF value; `optional` wraps it as the variant Some / None."""
    if optional:
        if value is None:
            return {"tag": "None", "value": {"#tup": []}}
        return {"tag": "Some", "value": encode(value)}
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool | int | str):
        return value
    if hasattr(value, "_fields"):  # a record (NamedTuple)
        hints = getattr(type(value), "__annotations__", {})
        return {
            f: encode(getattr(value, f), optional="None" in str(hints.get(f, "")))
            for f in value._fields
        }
    if isinstance(value, tuple | list):
        return {"#tup": [encode(v) for v in value]}
    if isinstance(value, frozenset | set):
        return {"#set": sorted(encode(v) for v in value)}
    raise TypeError(f"cannot encode {value!r} as ITF")


def encode_state(s: State) -> dict[str, Any]:
    return {name: encode(getattr(s, name)) for name in State._fields}


def _picks(move: Move) -> dict[str, Any]:
    a = move.action
    if move.kind == "device":
        return {"cq": a.args[0], **({"through": "effect"} if a.name == EFFECT else {})}
    if move.kind == "refuse":
        return {"action": a.name, "args": {"#tup": list(a.args)}}
    return {"args": {"#tup": list(a.args)}}


def to_itf(
    bounds: Bounds,
    backend: str,
    prompts: Sequence[int],
    moves: Sequence[Move],
    states: Sequence[State],
    *,
    failure: Divergence | None = None,
    bug: str | None = None,
    seed: int | None = None,
    config: str | None = None,
    sampling: str = "greedy",
    sampling_seed: int = 0,
) -> dict[str, Any]:
    """The whole trace: state 0 is the initial state, state i+1 follows moves[i]."""
    rows = [{"#meta": {"index": 0}, **encode_state(initial_state(bounds)),
             "mbt::actionTaken": "init", "mbt::nondetPicks": {}}]
    for i, (move, state) in enumerate(zip(moves, states, strict=True)):
        rows.append({
            "#meta": {"index": i + 1},
            **encode_state(state),
            "mbt::actionTaken": move.action.name if move.kind == "act" else move.kind,
            "mbt::nondetPicks": _picks(move),
        })
    meta = {
        "model": MODEL,
        "version": VERSION,
        # The validation-only bounds are unset here: traces stay as they were before them.
        "bounds": {k: v for k, v in bounds._asdict().items() if k not in _VALIDATION or v},
        "backend": backend,
        "config": config or CONFIGS[backend][0],
        "sampling": sampling,
        "sampling_seed": sampling_seed,
        "prompts": list(prompts),
        "bug": bug,
        "seed": seed,
        "failure": None if failure is None else {
            "step": failure.step + 1, "kind": failure.kind, "message": failure.message},
    }
    return {
        "#meta": {
            "format": "ITF",
            "format-description": "https://apalache-mc.org/docs/adr/015adr-trace.html",
            "source": "ttmirror conformance",
            "description": f"{len(moves)} moves"
            + (f"; fails at state {failure.step + 1}: {failure.kind}" if failure else ""),
            "ttmirror": meta,
        },
        "vars": VARS,
        "states": rows,
    }


def write(path: Path, trace: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, indent=1) + "\n")
    return path


class Loaded:
    """A parsed trace: what to rebuild, the moves, and the model states it claims."""

    def __init__(self, bounds: Bounds, backend: str, prompts: tuple[int, ...],
                 moves: list[Move], states: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        self.bounds = bounds
        self.backend = backend
        self.config = str(meta.get("config") or CONFIGS.get(backend, ("?",))[0])
        self.sampling = str(meta.get("sampling") or "greedy")
        self.sampling_seed = int(meta.get("sampling_seed") or 0)
        self.prompts = prompts
        self.moves = moves
        self.states = states
        self.meta = meta


def load(path: Path) -> Loaded:
    """Parse and validate a trace; raises TraceError with a one-line reason."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path} is not JSON: {e}") from None
    try:
        meta = data["#meta"]["ttmirror"]
        if meta["model"] != MODEL or meta["version"] != VERSION:
            raise TraceError(f"{path} is a trace of {meta['model']!r} v{meta['version']}, "
                             f"not {MODEL!r} v{VERSION}")
        if data.get("vars") != VARS:
            raise TraceError(f"{path}: vars {data.get('vars')} are not this model's {VARS}")
        fields = dict(meta["bounds"])
        bounds = Bounds(**{**fields, "max_tokens_of": tuple(fields.get("max_tokens_of", ())),
                           "host_sync_of": tuple(fields.get("host_sync_of", ()))})
        prompts = tuple(int(p) for p in meta["prompts"])
        states = data["states"]
        if not states or states[0]["mbt::actionTaken"] != "init":
            raise TraceError(f"{path}: state 0 must be the initial state (action init)")
        moves = [_move(s) for s in states[1:]]
        for i, s in enumerate(states):
            if s["#meta"]["index"] != i:
                raise TraceError(f"{path}: state {i} has index {s['#meta']['index']}")
    except TraceError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TraceError(f"{path} is not a ttmirror ITF trace: {type(e).__name__}: {e}") from None
    return Loaded(bounds, str(meta["backend"]), prompts, moves, states, meta)


def _move(row: dict[str, Any]) -> Move:
    name, picks = row["mbt::actionTaken"], row["mbt::nondetPicks"]
    if name == "device":
        kind = EFFECT if picks.get("through") == "effect" else "device"
        return Move("device", Action(kind, (int(picks["cq"]),)))
    args = tuple(int(a) for a in picks["args"]["#tup"])
    if name == "refuse":
        return Move("refuse", Action(str(picks["action"]), args))
    return Move("act", Action(str(name), args))

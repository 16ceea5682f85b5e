"""Traces in the Informal Trace Format (ITF), the JSON of Apalache and Quint: the one codec for
both kinds of trace ttmirror writes.

- Regression traces of the lockstep (`to_itf`, `load`; `ttmirror replay`): the model state after
  every move, and the move itself in Quint's model-based testing variables
  (``mbt::actionTaken``, ``mbt::nondetPicks``): model actions, device completions (``device``
  with the queue it advanced) and refusals (``refuse`` with the disabled action the
  implementation had to reject). ``#meta.ttmirror`` says what to rebuild: bounds, backend,
  prompts, the planted bug that was on, the seed, the failure, and with spec tokens the drafter
  (``drafter``: its seed and agreement, or its agreeing rows), which decides what a launch's
  verification accepts.
- Recorded runs of the runner (`write_events`, `read_events`, `events_from`; `ttmirror
  validate`): one state per recorded event (`impl.events.Event`), its action and its arguments
  and details in the same two variables, one state per line so a long run streams.

Values follow ITF: tuples ``{"#tup": [...]}``, sets ``{"#set": [...]}``, records as objects,
enums by name, optional fields as the variants ``None`` / ``Some`` (`encode`, `decode`). Nothing
here imports the runner: reading a trace needs the model and these records only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from ttmirror.conformance.traces.configs import CONFIGS
from ttmirror.conformance.traces.moves import EFFECT, Divergence, Drafter, Move
from ttmirror.impl.events import Event
from ttmirror.impl.rows import Row
from ttmirror.model.actions import FAULT, Action
from ttmirror.model.state import RING, Bounds, State, initial_state

MODEL = "mirrored-sampled-ids"
VERSION = 3
"""2: rows carry `partial`, requests `prefill_left`, bounds the preemption policy, chunking and
host sync; 3: the records carry speculative decoding's fields (spec rule 13: rows `spec`,
`placed`, `drafts`; steps `accepted`, `host_counts`; slots `counts`, `positions`; requests
`placeholders`, `drafts_ready`), at their defaults without drafts. An older trace is refused
with its version."""
VARS = ["allocated", "next_slot", "queue", "slots", "requests", "broken",
        "mbt::actionTaken", "mbt::nondetPicks"]


_VALIDATION = ("max_tokens_of", "host_sync_of", "chunk_per_step", "state", "state_rows",
               "subsets")
"""Bounds only a validated serving run sets, and the bounds of spec rule 14; left out of a trace
where they hold the ring's values (`RING`), so that the traces written before them stay as they
were."""
_BOUNDS_DEFAULTS = RING
"""What a trace that leaves a bound out means: the traces before rule 14 are of the ring."""

_AT_DEFAULT: dict[tuple[str, str], Any] = {("Row", "idx"): -1, ("Request", "state_row"): -1,
                                           ("State", "table"): ()}
"""Record fields of spec rule 14 (state rows), left out of a state where they hold this value
(always with the ring): a trace written before them encodes the same states."""


class TraceError(ValueError):
    """The file is not a ttmirror ITF trace for this model."""


NONE = {"tag": "None", "value": {"#tup": []}}


_NO_DEFAULT = object()


def encode(value: Any, optional: bool = False) -> Any:
    """An ITF value; `optional` wraps it as the variant Some / None (a bare None is None)."""
    if optional:
        if value is None:
            return NONE
        return {"tag": "Some", "value": encode(value)}
    if value is None:
        return NONE
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool | int | str):
        return value
    if hasattr(value, "_fields"):  # a record (NamedTuple)
        kind = type(value).__name__
        hints = getattr(type(value), "__annotations__", {})
        return {
            f: encode(getattr(value, f), optional="None" in str(hints.get(f, "")))
            for f in value._fields
            if _AT_DEFAULT.get((kind, f), _NO_DEFAULT) != getattr(value, f)
        }
    if isinstance(value, tuple | list):
        return {"#tup": [encode(v) for v in value]}
    if isinstance(value, frozenset | set):
        return {"#set": sorted(encode(v) for v in value)}
    raise TypeError(f"cannot encode {value!r} as ITF")


def decode(value: Any) -> Any:
    """The Python value of an ITF value: tuples, frozensets, None or the Some's value, records
    as dicts of their fields; TraceError (one line) for anything else."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, dict):
        if set(value) == {"#tup"} and isinstance(value["#tup"], list):
            return tuple(decode(v) for v in value["#tup"])
        if set(value) == {"#set"} and isinstance(value["#set"], list):
            return frozenset(decode(v) for v in value["#set"])
        if set(value) == {"tag", "value"} and value["tag"] in ("None", "Some"):
            return None if value["tag"] == "None" else decode(value["value"])
        if not any(k.startswith("#") for k in value):
            return {k: decode(v) for k, v in value.items()}
    raise TraceError(f"not an ITF value: {value!r}")


def encode_state(s: State) -> dict[str, Any]:
    return {name: encode(getattr(s, name)) for name in State._fields
            if _AT_DEFAULT.get(("State", name), _NO_DEFAULT) != getattr(s, name)}


def _picks(move: Move) -> dict[str, Any]:
    a = move.action
    if move.kind == "device":
        return {"cq": a.args[0], **({"through": "effect"} if a.name == EFFECT else {})}
    if move.kind == "refuse":
        return {"action": a.name, "args": {"#tup": list(a.args)},
                **({"drafts": {"#tup": list(a.drafts)}} if a.drafts else {})}
    return {"args": {"#tup": list(a.args)},
            **({"drafts": {"#tup": list(a.drafts)}} if a.drafts else {})}


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
    drafter: Drafter | None = None,
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
        "bounds": {k: v for k, v in bounds._asdict().items()
                   if k not in _VALIDATION or v != getattr(_BOUNDS_DEFAULTS, k)},
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
    if bounds.spec_tokens:  # without drafts the trace is as it always was
        meta["drafter"] = (drafter or Drafter()).as_json()
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
        self.drafter = (Drafter.from_json(meta["drafter"]) if bounds.spec_tokens
                        else None)
        """With spec tokens, the run's drafter."""
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
        bounds = RING._replace(**{**fields,
                                  "max_tokens_of": tuple(fields.get("max_tokens_of", ())),
                                  "host_sync_of": tuple(fields.get("host_sync_of", ()))})
        prompts = tuple(int(p) for p in meta["prompts"])
        states = data["states"]
        if not states or states[0]["mbt::actionTaken"] != "init":
            raise TraceError(f"{path}: state 0 must be the initial state (action init)")
        moves = [_move(s) for s in states[1:]]
        for i, s in enumerate(states):
            if s["#meta"]["index"] != i:
                raise TraceError(f"{path}: state {i} has index {s['#meta']['index']}")
        loaded = Loaded(bounds, str(meta["backend"]), prompts, moves, states, meta)
    except TraceError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TraceError(f"{path} is not a ttmirror ITF trace: {type(e).__name__}: {e}") from None
    return loaded


def _move(row: dict[str, Any]) -> Move:
    name, picks = row["mbt::actionTaken"], row["mbt::nondetPicks"]
    if name == "device":
        kind = EFFECT if picks.get("through") == "effect" else "device"
        return Move("device", Action(kind, (int(picks["cq"]),)))
    args = tuple(int(a) for a in picks["args"]["#tup"])
    drafts = tuple(int(d) for d in picks["drafts"]["#tup"]) if "drafts" in picks else ()
    if name == "refuse":
        return Move("refuse", Action(str(picks["action"]), args, drafts))
    return Move("act", Action(str(name), args, drafts))


# --- recorded runs (`ttmirror validate`) ---------------------------------------------------------

EVENTS_FORMAT = "ttmirror-events"
EVENTS_VERSION = 5
"""2: a schedule and a combine carry their rows as `Row` records (1 had parallel tuples); 3: each
step phase carries the step's phase as the runner's state shows it once done, and an apply how
many tokens each request it delivered to now holds; 4: a row carries its drafts (spec rule 13:
`spec`, the host-staged `drafts`, and `pos` -1 where the device holds it); 5: a run with drafts
says so (its allocate's `spec_tokens`), and each of its readbacks what its verification accepted
per row (`counts`, a + 1). An older file is refused with its version."""


class EventsError(TraceError):
    """The file or the events are not a recorded run this model can check (one line)."""


_EVENTS_META = {"format": "ITF",
                "ttmirror": {"format": EVENTS_FORMAT, "version": EVENTS_VERSION}}
_EVENTS_VARS = ["mbt::actionTaken", "mbt::nondetPicks"]
_OPEN = ', "states": ['
"""How `write_events`'s first line ends: the states follow, one per line."""


def _event_state(i: int, e: Event) -> dict[str, object]:
    return {"#meta": {"index": i}, "mbt::actionTaken": e.action,
            "mbt::nondetPicks": {"args": encode(e.args), **{k: encode(v) for k, v in e.detail}}}


LARGEST = 2**31 - 1
"""No id, count or index of a recorded run is larger (a larger one is a malformed trace)."""
_INT, _BOOL, _STR, _ROWS = "int", "bool", "str", "rows"
_ROW_FIELDS: dict[str, Any] = {"req": _INT, "pos": "id", "prev_row": "int?", "live": _BOOL,
                               "partial": _BOOL, "host_pos": "int?", "host_id": "id",
                               "spec": _INT, "drafts": ("tuple", "id"), "idx": "id"}
"""A `Row`'s fields and their types (`host_id` may be the placeholder, -1; `pos` is -1 for a
mirror row with drafts, whose position is on the device; `idx`, the state row, only with state
rows)."""
_ROW_OPTIONAL = frozenset({"idx"})
assert tuple(_ROW_FIELDS) == Row._fields
_SCHEMA: dict[str, tuple[int | None, dict[str, Any], frozenset[str]]] = {
    # action: (arguments (None: one or more), detail name -> type, optional details)
    "allocate": (0, {"depth": _INT, "slots": _INT, "guard": _BOOL, "preempt_policy": _STR,
                     "prefill_chunks": _INT, "device_waits": _BOOL, "spec_tokens": _INT,
                     "subsets": _BOOL, "state": _STR, "state_rows": _INT},
                 frozenset({"device_waits", "spec_tokens", "subsets", "state", "state_rows"})),
    "arrive": (1, {"prompt": _INT, "max_tokens": _INT, "host_sync": _BOOL,
                   "prefill_chunks": _INT, "seed": _INT}, frozenset({"seed"})),
    "schedule": (None, {"slot": _INT, "rows": _ROWS}, frozenset()),
    "combine": (1, {"rows": _ROWS, "phase": _STR}, frozenset()),
    "launch": (1, {"phase": _STR}, frozenset()),
    "readback_issue": (1, {"phase": _STR}, frozenset()),
    "readback_complete": (1, {"phase": _STR, "counts": ("tuple", _INT)}, frozenset({"counts"})),
    "apply": (0, {"step": _INT, "delivered": ("tuple", ("pair", _INT)),
                  "counts": ("tuple", ("pair", _INT))}, frozenset()),
    "release": (1, {}, frozenset()),
    "release_row": (1, {}, frozenset()),
    "finish": (1, {}, frozenset()),
    "abort": (1, {"reason": _STR}, frozenset({"reason"})),
    "refuse": (1, {"reason": _STR}, frozenset()),
    "preempt": (1, {}, frozenset()),
    "resume": (1, {}, frozenset()),
    "chunk_prefill": (2, {}, frozenset()),
    FAULT: (1, {"phase": _STR, "failed": ("tuple", _INT)}, frozenset()),
    "device_wait": (1, {}, frozenset()),
    "host_read": (1, {}, frozenset()),
}
"""What a recorded event may hold: anything else is a malformed trace, not a divergence."""


def _typed(value: object, kind: Any) -> bool:
    """Is `value` (decoded) of the schema type `kind`?"""
    if kind == _INT:
        return type(value) is int and 0 <= value <= LARGEST
    if kind == "id":
        return type(value) is int and -1 <= value <= LARGEST
    if kind == "int?":
        return value is None or _typed(value, _INT)
    if kind == _BOOL:
        return type(value) is bool
    if kind == _STR:
        return type(value) is str
    if kind == _ROWS:
        return isinstance(value, tuple) and all(
            isinstance(r, dict) and set(_ROW_FIELDS) - _ROW_OPTIONAL <= set(r) <= set(_ROW_FIELDS)
            and all(_typed(r[f], t) for f, t in _ROW_FIELDS.items() if f in r) for r in value)
    if isinstance(kind, tuple) and kind[0] == "pair":
        return (isinstance(value, tuple) and len(value) == 2
                and all(_typed(v, kind[1]) for v in value))
    if isinstance(kind, tuple) and kind[0] == "tuple":
        return isinstance(value, tuple) and all(_typed(v, kind[1]) for v in value)
    return False


def _event(i: int, state: object) -> Event:
    """State `i` of a trace as an event, checked against `_SCHEMA` (EventsError: one line)."""
    try:
        if not isinstance(state, dict):
            raise TypeError("not an object")
        action = state["mbt::actionTaken"]
        picks = dict(state["mbt::nondetPicks"])
        args = decode(picks.pop("args"))
        detail = {k: decode(v) for k, v in picks.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise EventsError(f"state {i} is not an event ({type(e).__name__}: {e})") from None
    if not isinstance(action, str) or action not in _SCHEMA:
        raise EventsError(f"state {i}: {action!r} is no action of a recorded run "
                          f"({', '.join(_SCHEMA)})")
    count, fields, optional = _SCHEMA[action]
    if not isinstance(args, tuple) or not all(_typed(a, _INT) for a in args) or (
            len(args) != count if count is not None else not args):
        raise EventsError(f"state {i}: {action} takes "
                          f"{'one or more' if count is None else count} arguments, integers in "
                          f"[0, 2**31), not {args!r}")
    for name, value in detail.items():
        if name not in fields or not _typed(value, fields[name]):
            raise EventsError(f"state {i}: {action}'s {name} = {value!r} is not "
                              f"{fields.get(name, 'one of its details')}")
    missing = set(fields) - set(detail) - optional
    if missing:
        raise EventsError(f"state {i}: {action} lacks {', '.join(sorted(missing))}")
    if action == "chunk_prefill" and args[1] > 1:
        raise EventsError(f"state {i}: chunk_prefill's second argument is 0 or 1, not {args[1]}")
    if "rows" in detail:
        detail["rows"] = tuple(Row(**r) for r in detail["rows"])  # type: ignore[attr-defined]
    if action == "schedule" and tuple(r.req for r in detail["rows"]) != args:
        raise EventsError(f"state {i}: schedule's rows must be its requests' {args}, in order")
    return Event(action, args, tuple(detail.items()))


def _check_events_meta(data: object) -> None:
    meta = data.get("#meta") if isinstance(data, dict) else None
    ours = meta.get("ttmirror") if isinstance(meta, dict) else None
    if not isinstance(ours, dict) or ours.get("format") != EVENTS_FORMAT:
        raise EventsError(f"not a recorded run ({EVENTS_FORMAT} v{EVENTS_VERSION}); a regression "
                          "trace of the lockstep replays with `ttmirror replay`")
    if ours.get("version") != EVENTS_VERSION:
        raise EventsError(f"a recorded run of version {ours.get('version')!r}; this ttmirror "
                          f"reads version {EVENTS_VERSION} (record the run again)")


def write_events(events: Iterable[Event], path: str | os.PathLike[str]) -> int:
    """Write the run as an ITF trace of Quint's model-based-testing variables, one state per
    event and one per line (still one JSON document), so `read_events` can stream it back
    without holding it whole; returns the number of events written."""
    n = 0
    with open(path, "w") as f:
        f.write(json.dumps({"#meta": _EVENTS_META, "vars": _EVENTS_VARS})[:-1] + _OPEN + "\n")
        for i, e in enumerate(events):
            f.write(("," if i else "") + json.dumps(_event_state(i, e)) + "\n")
            n += 1
        f.write("]}\n")
    return n


def read_events(path: str | os.PathLike[str]) -> Iterator[Event]:
    """The events of a trace file, streamed when it has `write_events`'s one-state-per-line
    layout (else read whole, as `events_from`). EventsError (one line) where it stops being a
    trace: a truncated file fails at its end, after the events before it were yielded."""
    with open(path) as f:
        head = f.readline()
        if not head.rstrip().endswith(_OPEN):
            try:
                data = json.loads(head + f.read())
            except json.JSONDecodeError as e:
                raise EventsError(f"not JSON (truncated?): {e.msg} at line {e.lineno}") from None
            yield from events_from(data)
            return
        try:
            meta = json.loads(head.rstrip()[: -len(_OPEN)] + "}")
        except json.JSONDecodeError as e:
            raise EventsError(f"not JSON: {e.msg} in its first line") from None
        _check_events_meta(meta)
        i, closed = 0, False
        for lineno, line in enumerate(f, start=2):
            text = line.strip()
            if text == "]}":
                closed = True
                break
            try:
                state = json.loads(text.removeprefix(","))
            except json.JSONDecodeError as e:
                raise EventsError(f"not JSON (truncated?): {e.msg} at line {lineno}") from None
            yield _event(i, state)
            i += 1
        if not closed:
            raise EventsError(f"the trace ends after {i} events, unclosed (truncated?)")
        if i == 0:
            raise EventsError("the trace has no events")


def events_from(data: object) -> list[Event]:
    """The events of a trace read whole (one JSON document, in any layout); EventsError (one
    line) if it is not a recorded run."""
    if not isinstance(data, dict):
        raise EventsError("not an ITF trace (a JSON object with states)")
    _check_events_meta(data)
    out = [_event(i, state) for i, state in enumerate(data.get("states") or [])]
    if not out:
        raise EventsError("the trace has no events")
    return out

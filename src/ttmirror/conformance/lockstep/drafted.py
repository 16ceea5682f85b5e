"""The abstraction with drafts (spec rule 13): a row's position, placed position and drafts, and
a slot's draft part, as the model shows them (`project_*`) and as the implementation's books and
device data show them (`row_of`, `slot_of`, `content_of`); `abstraction.py` holds the table.

A row's position is its request's delivered tokens plus what its rows in the earlier in-flight
steps yielded: on the implementation's side, the counts those steps' launches wrote on the device
(`positions`), as the model's `true_pos` sums their accepted counts. Tokens are read relative to
it: the row's newest token at its position, the slot's run after it, the slot's newest token
count tokens past it, and drafts as the drafter's proposals after the token they follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ttmirror.impl import rows
from ttmirror.impl.runner import RunnerView, SlotView
from ttmirror.model.actions import drafts_after
from ttmirror.model.state import GARBAGE, Row, Slot, Token

if TYPE_CHECKING:
    from ttmirror.conformance.lockstep.abstraction import Context, Seen
    from ttmirror.conformance.lockstep.observe import Observed

OVERWRITTEN = "overwritten"
"""A part of a slot that a later step wrote over while the slot was still its writer's."""

type Field = int | str | None


class SlotRow(NamedTuple):
    """What a slot holds for one row beside its newest token; each field None until the
    command writing it completed."""

    yielded: Field
    """a + 1: how many tokens the row yielded (the slot's count)."""
    position: Field
    """The newest token's position as the device advanced it."""
    run: tuple[Token, ...] | str | None
    """The tokens the row yielded, in order (its accepted drafts, then the target's token)."""
    drafts: tuple[Token | str | None, ...]
    """The drafter's K proposals after the newest token, per lane."""


ERASED = SlotRow(None, None, None, ())
"""A row whose token is garbage (dropped since, or a partial prefill's): nothing reads it."""

ROW_FIELDS = ("pos", "placed", "drafts")
"""A row's fields that device data decides, once the command writing them completed."""


def seen_part(name: str, q: int, seen: Seen) -> bool:
    """Has the command deciding row field `name` of queue position q completed?"""
    if name == "pos":
        return q in seen.combined
    if name == "placed":
        return (q, "base") in seen.lanes
    return any(lane.startswith("lane") for at, lane in seen.lanes if at == q)


def masked(step_rows: Sequence[Row | rows.Row], values: Sequence[int]) -> tuple[int, ...]:
    """`values` per row, 0 for a row that yields nothing (dropped, or a partial prefill's): what
    the device computed there is never read."""
    return tuple(v if r.live and not r.partial else 0
                 for r, v in zip(step_rows, values, strict=False))


def positions(view: RunnerView, observed: Observed, q: int) -> tuple[int, ...] | None:
    """The positions of step q's rows: delivered tokens plus the counts that the request's live
    rows of the earlier in-flight steps yielded on the device; None while one is not known."""
    out = []
    for row in view.queue[q].rows:
        total = len(view.requests[row.req].delivered) if row.req in view.requests else 0
        for earlier in view.queue[:q]:
            counts = observed.counts.get(earlier.n)
            for j, other in enumerate(earlier.rows):
                if other.live and not other.partial and other.req == row.req:
                    if counts is None:
                        return None
                    total += counts[j]
        out.append(total)
    return tuple(out)


# --- the model's side ----------------------------------------------------------------------------

def project_row(row: Row, q: int, seen: Seen) -> Row:
    """A live model row as the implementation can show it: its position and newest token once
    the combine's ids exist, a mirror row's placed position and drafts once the device wrote
    them (a host row's were staged by the host)."""
    ids = q in seen.combined
    host = row.prev_row is None
    lanes = [(q, f"lane{j + 1}") in seen.lanes for j in range(row.spec)]
    drafts: tuple[Any, ...] = row.drafts  # None where a lane is not written yet
    if not host:
        drafts = (tuple(d if lane else None for d, lane in zip(row.drafts, lanes, strict=True))
                  if any(lanes) else ())
    return row._replace(pos=row.pos if ids else -1, consumed=row.consumed if ids else None,
                        placed=row.placed if host or (q, "base") in seen.lanes else None,
                        drafts=drafts)


def project_slot(slot: Slot, k: int, seen: Seen, spec: int) -> tuple[SlotRow, ...] | None:
    """A model slot's draft part per row, each part once its command completed."""
    if not slot.content or slot.released:
        return None
    has = {part for at, part in seen.parts if at == k}
    run_seen = "count" in has and all(f"tokens{j}" in has for j in range(spec + 1))
    out = []
    for i, token in enumerate(slot.content):
        if token[0] < 0:  # garbage: a dropped or partial row's
            out.append(ERASED)
            continue
        count = slot.counts[i]
        req, newest = token
        out.append(SlotRow(
            yielded=count if "count" in has else None,
            # With state rows the position is the table's, not the slot's (the model keeps none).
            position=slot.positions[i] if "position" in has and slot.positions else None,
            run=tuple((req, newest - count + 1 + j) for j in range(count)) if run_seen else None,
            drafts=tuple(d if f"drafts{j}" in has else None
                         for j, d in enumerate(drafts_after(token, spec))),
        ))
    return tuple(out)


# --- the implementation's side -------------------------------------------------------------------

def row_of(row: rows.Row, q: int, step: int, i: int, context: Context,
           observed: Observed | None, seen: Seen) -> Row:
    """A live implementation row with drafts as the model's (see `project_row`)."""
    ids = q in seen.combined
    pos = context.truth(step, i) if ids else -1
    parts = observed.lanes.get(step, {}) if observed is not None else {}
    consumed = None
    if ids and observed is not None:
        consumed = context.token(row.req, pos, observed.consumed[step][i])
    host = row.prev_row is None
    placed = parts["base"][i] if (q, "base") in seen.lanes else row.pos if host else None
    # Drafts follow the newest token: a host row's at the position the host staged.
    newest = row.pos if host else pos
    drafts: list[Any] = []  # tokens, None where a lane is not written yet
    for j in range(row.spec):
        lane = f"lane{j + 1}"
        if (q, lane) in seen.lanes:
            drafts.append(context.draft_token(row.req, newest, j + 1, parts[lane][i]))
        elif host:
            staged = row.drafts[j] if j < len(row.drafts) else None
            drafts.append(GARBAGE if staged is None
                          else context.draft_token(row.req, newest, j + 1, staged))
        else:
            drafts.append(None)
    return Row(req=row.req, pos=pos, prev_row=row.prev_row, consumed=consumed, live=True,
               partial=row.partial, spec=row.spec, placed=placed, idx=row.idx,
               drafts=() if not host and not any(d is not None for d in drafts)
               else tuple(drafts))


def content_of(context: Context, observed: Observed, k: int, writer: int,
               ids: tuple[int, ...]) -> tuple[Token, ...]:
    """Slot k's ids as the model's content: each row's newest token, count tokens past its
    position (garbage for a dropped or partial row)."""
    counts = _part(observed, k, "count", writer)
    out = []
    partial = context.partials.get(writer, frozenset())
    for i, ((req, _), value) in enumerate(zip(context.layouts[writer], ids, strict=False)):
        count = counts[i] if isinstance(counts, tuple) else None
        token = (GARBAGE if count is None
                 else context.token(req, context.truth(writer, i) + count, value))
        dropped = context.dropped_since(req, writer) or i in partial
        out.append(GARBAGE if dropped or token[0] != req else token)
    return tuple(out)


def slot_of(k: int, slot: SlotView, context: Context, observed: Observed | None,
            seen: Seen) -> tuple[SlotRow, ...] | None:
    """Slot k's draft part per row, as written by the slot's writer (see `project_slot`)."""
    writer = slot.writer
    if slot.released or not slot.written or writer is None or observed is None:
        return None
    has = {part for at, part in seen.parts if at == k}
    spec = context.spec

    def value(part: str, i: int) -> Field:
        if part not in has:
            return None
        ids = _part(observed, k, part, writer)
        return ids[i] if isinstance(ids, tuple) else OVERWRITTEN

    out = []
    partial = context.partials.get(writer, frozenset())
    for i, (req, _) in enumerate(context.layouts[writer]):
        if context.dropped_since(req, writer) or i in partial:
            out.append(ERASED)
            continue
        truth = context.truth(writer, i)
        count = value("count", i)
        run: tuple[Token, ...] | str | None = None
        if "count" in has and all(f"tokens{j}" in has for j in range(spec + 1)):
            lanes = [v for j in range(spec + 1) if isinstance(v := value(f"tokens{j}", i), int)]
            if not isinstance(count, int) or len(lanes) < spec + 1:
                run = OVERWRITTEN
            else:  # a count past the lanes is garbage beyond them
                run = tuple(context.token(req, truth + 1 + j, lanes[j]) if j <= spec else GARBAGE
                            for j in range(count))
        newest = truth + count if isinstance(count, int) else -1
        drafts = []
        for j in range(spec):
            v = value(f"drafts{j}", i)
            drafts.append(context.draft_token(req, newest, j + 1, v) if isinstance(v, int)
                          else v)
        position = None if context.state_rows else value("position", i)
        out.append(SlotRow(count, position, run, tuple(drafts)))
    return tuple(out)


def _part(observed: Observed, k: int, part: str, writer: int) -> tuple[int, ...] | str | None:
    """Slot k's `part` as `writer` wrote it; OVERWRITTEN if a later step wrote it since; None
    if it was never written."""
    found = observed.parts.get(k, {}).get(part)
    if found is None:
        return None
    step, ids = found
    return ids if step == writer else OVERWRITTEN


def slot_diff(k: int, expected: tuple[SlotRow, ...] | None,
              got: tuple[SlotRow, ...] | None) -> list[str]:
    """Readable differences of a slot's draft part (device data), row by row."""
    if expected is None or got is None or len(expected) != len(got):
        return [f"slots[{k}].rows (device data): model {expected} != impl {got}"]
    out = []
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        for f in SlotRow._fields:
            x, y = getattr(a, f), getattr(b, f)
            if x != y:
                out.append(f"slots[{k}].rows[{i}].{f} (device data): model {x} != impl {y}")
    return out

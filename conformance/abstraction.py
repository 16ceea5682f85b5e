"""The abstraction function: what the implementation's state means in the model's vocabulary.

`abstract(view, context, observed, seen)` maps a `Runner.abstract()` snapshot and the device
data the observer saw (`observe.py`) to an `Abstract` value; `project(state, seen)` maps a model
`State` to the same type. Conformance after every move is ``abstract(...) == project(...)``,
where `seen` says which device effects have completed: a model effect counts from the moment the
command that stands for it completes (a device move, or a host-blocking call), not before. The
mapping, field by field:

=====================  ===========================================  ==============================
model                  implementation                               note
=====================  ===========================================  ==============================
allocated, next_slot   same fields                                  exact
queue[q].slot,         StepView.slot, src_slot, phase               exact; phases by name
src_slot, phase
queue[q].rows[i]       impl Row(req, pos, prev_row, live, partial)  a dropped row (live False)
req, pos, prev_row,                                                 maps to the model's DEAD_ROW
live, partial
rows[i].consumed       the combine's output ids (device data),      once its command completed;
                       copied when the command completes            before that, None on both
                                                                    sides; id -> token below
queue[q].host_copy     StepView.host_copy (int ids)                 id -> token, below
slots[k].content       the slot's ids (device data), copied when    once the sampler completed:
                       the sampler's command completes; () when     before that, PENDING on both
                       released; None when never written            sides; id -> token below
slots[k].released      SlotView.released                            exact
requests[r]            RequestView(status, delivered, closed_at,    absent from the view = ABSENT;
                       unchecked, preemptions, prefill_left)        statuses by name; delivered
                                                                    ids -> tokens
broken                 (ghost, no counterpart)                      checked as a model invariant
=====================  ===========================================  ==============================

No model variable is left unobserved on the emulated device or the cpu backend. On a chip there
is no view of device memory: the observer is absent, nothing counts as completed, and `consumed`
and `content` stay None / PENDING on both sides (the lockstep says so in its output).

Tokens. The model's token ``(r, p)`` is "position p of request r's sequence": position 0 is the
request's prompt id, and the probe's reference sequence (`ProbeReference.sequence`) gives the rest.
An id read for a row of request r at position p maps to ``(r, p)`` when it equals the reference
id there, to PLACEHOLDER when it is the host's placeholder (-1 as uint32), and to GARBAGE
otherwise. The probe's step is a bijection of the input id at each position, so a stale input
never yields the right id by chance. Slot content follows the model's `_drop`: a token of request
r in a slot written by step n is GARBAGE once r was finished, aborted or preempted (drop policy)
after step n was scheduled (its row was dropped, or its token scrubbed). A partial-prefill row's
sampled id is GARBAGE in the slot and the host copy: it is no token of the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..impl import rows, runner
from ..impl.runner import PLACEHOLDER_ID, RunnerView
from ..model.actions import DEAD_ROW
from ..model.state import GARBAGE, PLACEHOLDER, Phase, Row, State, Status, Token
from .observe import Observed

PENDING = "pending"
"""A slot's content while the sampler that writes it has not completed on the device."""
UINT32 = 0xFFFFFFFF

type Content = tuple[Token, ...] | str | None

DEAD = DEAD_ROW
"""What any dropped row is, on both sides: the model's DEAD_ROW."""


class AStep(NamedTuple):
    slot: int
    src_slot: int | None
    phase: str
    """The phase's name, shared by the model's `Phase` and the runner's."""
    rows: tuple[Row, ...]
    """The model's rows; `consumed` is None until the combine's output is seen."""
    host_copy: tuple[Token, ...] | None


class ARequest(NamedTuple):
    status: str
    """The status's name, shared by the model's `Status` and the runner's."""
    delivered: tuple[Token, ...]
    closed_at: int | None
    unchecked: bool
    preemptions: int
    prefill_left: int


class Abstract(NamedTuple):
    """The observable part of a state, shared by the model and the implementation."""

    allocated: bool
    next_slot: int
    queue: tuple[AStep, ...]
    slots: tuple[tuple[Content, bool], ...]
    """Per slot: (content, released)."""
    requests: tuple[ARequest, ...]


class Seen(NamedTuple):
    """Which device effects have completed, by the model's names for them."""

    combined: frozenset[int] = frozenset()
    """Queue positions whose combine output exists on the device."""
    written: frozenset[int] = frozenset()
    """Slots whose current writer's sampler has completed."""


@dataclass
class Context:
    """What turns ids into tokens: prompts, reference sequences, and the run's history."""

    prompts: tuple[int, ...]
    references: list[list[int]]
    """references[r][p - 1] is the id at position p of request r (p >= 1)."""
    layouts: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Step number -> (req, pos) per row, as scheduled (kept after the step retires)."""
    partials: dict[int, frozenset[int]] = field(default_factory=dict)
    """Step number -> its partial-prefill rows."""
    drops: list[tuple[int, int]] = field(default_factory=list)
    """(request, steps scheduled so far) at each finish, abort or preemption (drop policy)."""
    prefill_chunks: int = 1

    def id_at(self, req: int, pos: int) -> int | None:
        if pos == 0:
            return self.prompts[req]
        ref = self.references[req]
        return ref[pos - 1] if 1 <= pos <= len(ref) else None

    def token(self, req: int, pos: int, value: int) -> Token:
        """The model token for id `value` read for request `req` at position `pos`."""
        if value == self.id_at(req, pos):
            return (req, pos)
        return PLACEHOLDER if value & UINT32 == PLACEHOLDER_ID & UINT32 else GARBAGE

    def dropped_since(self, req: int, step: int) -> bool:
        """Was `req` finished, aborted or preempted after step number `step` was scheduled?"""
        return any(r == req and at > step for r, at in self.drops)


def project(s: State, seen: Seen) -> Abstract:
    """The model state as the implementation can show it once `seen` effects completed."""
    queue = []
    for q, step in enumerate(s.queue):
        combined = q in seen.combined
        queue.append(AStep(
            slot=step.slot,
            src_slot=step.src_slot,
            phase=step.phase.name,
            rows=tuple(
                (r if combined else r._replace(consumed=None)) if r.live else DEAD
                for r in step.rows
            ),
            host_copy=step.host_copy,
        ))
    slots = []
    for k, slot in enumerate(s.slots):
        content: Content = slot.content
        if content and not slot.released and k not in seen.written:
            content = PENDING
        slots.append((content, slot.released))
    return Abstract(
        allocated=s.allocated,
        next_slot=s.next_slot,
        queue=tuple(queue),
        slots=tuple(slots),
        requests=tuple(
            ARequest(r.status.name, r.delivered, r.closed_at, r.unchecked, r.preemptions,
                     r.prefill_left)
            for r in s.requests
        ),
    )


def seen_in(view: RunnerView, observed: Observed | None) -> Seen:
    """Which effects of the runner's in-flight steps and slots the device has completed."""
    if observed is None:
        return Seen()
    combined = frozenset(q for q, step in enumerate(view.queue) if step.n in observed.consumed)
    written = frozenset(
        k for k, slot in enumerate(view.slots)
        if slot.writer is not None and observed.content.get(k, (None, ()))[0] == slot.writer
    )
    return Seen(combined, written)


def abstract(view: RunnerView, context: Context, observed: Observed | None, seen: Seen
             ) -> Abstract:
    """The implementation's state in the model's terms (see the table above)."""
    queue = []
    for q, step in enumerate(view.queue):
        consumed = observed.consumed.get(step.n) if observed and q in seen.combined else None
        host_copy = None
        if step.host_copy is not None:
            host_copy = tuple(
                context.token(row.req, row.pos + 1, value)
                if row.live and not row.partial else GARBAGE
                for row, value in zip(step.rows, step.host_copy, strict=True)
            )
        queue.append(AStep(
            slot=step.slot,
            src_slot=step.src_slot,
            phase=phase_name(step.phase),
            rows=tuple(_row(context, row, consumed, i) for i, row in enumerate(step.rows)),
            host_copy=host_copy,
        ))
    slots = []
    for k, slot in enumerate(view.slots):
        content: Content = None
        if slot.released:
            content = ()
        elif slot.written:
            content = PENDING
            if observed is not None and k in seen.written:
                writer, ids = observed.content[k]
                content = _content(context, writer, ids)
        slots.append((content, slot.released))
    requests = []
    for r in range(len(context.prompts)):
        rv = view.requests.get(r)
        if rv is None:
            requests.append(ARequest(Status.ABSENT.name, (), None, False, 0,
                                     context.prefill_chunks - 1))
            continue
        delivered = tuple(context.token(r, i + 1, v) for i, v in enumerate(rv.delivered))
        requests.append(ARequest(status_name(rv.status), delivered, rv.closed_at, rv.unchecked,
                                 rv.preemptions, rv.prefill_left))
    return Abstract(view.allocated, view.next_slot, tuple(queue), tuple(slots), tuple(requests))


def _row(context: Context, row: rows.Row, consumed: tuple[int, ...] | None, i: int) -> Row:
    """The implementation's row as the model's: the consumed id, when seen, as a token."""
    if not row.live:
        return DEAD
    token = None if consumed is None else context.token(row.req, row.pos, consumed[i])
    return Row(req=row.req, pos=row.pos, prev_row=row.prev_row, consumed=token, live=True,
               partial=row.partial)


def _content(context: Context, writer: int, ids: tuple[int, ...]) -> tuple[Token, ...]:
    """A slot's ids as the model's content: one token per row of the step that wrote it."""
    out = []
    partial = context.partials.get(writer, frozenset())
    for i, ((req, pos), value) in enumerate(zip(context.layouts[writer], ids, strict=False)):
        token = context.token(req, pos + 1, value)
        dropped = context.dropped_since(req, writer) or i in partial
        out.append(GARBAGE if dropped or token[0] != req else token)
    return tuple(out)


def phase_name(phase: runner.Phase) -> str:
    """The model's phase of the same name (KeyError: the runner has a phase the model lacks)."""
    return Phase[phase.name].name


def status_name(status: runner.Status) -> str:
    """The model's status of the same name (KeyError: the runner has one the model lacks)."""
    return Status[status.name].name


def diff(expected: Abstract, got: Abstract) -> list[str]:
    """Readable differences, field by field (model first, implementation second): the queue
    first, so a combine's output is named before the slot the sampler then wrote from it."""
    out: list[str] = []
    for name in ("allocated", "next_slot"):
        a, b = getattr(expected, name), getattr(got, name)
        if a != b:
            out.append(f"{name}: model {a} != impl {b}")
    if len(expected.queue) != len(got.queue):
        out.append(f"queue length: model {len(expected.queue)} != impl {len(got.queue)}")
    for q, (a, b) in enumerate(zip(expected.queue, got.queue, strict=False)):
        for f in AStep._fields:
            x, y = getattr(a, f), getattr(b, f)
            if x == y:
                continue
            if f == "rows" and len(x) == len(y):
                for i, (rx, ry) in enumerate(zip(x, y, strict=True)):
                    if rx.consumed != ry.consumed:
                        out.append(f"queue[{q}].rows[{i}].consumed (device data): model "
                                   f"{rx.consumed} != impl {ry.consumed}")
                    if _books(rx) != _books(ry):
                        out.append(f"queue[{q}].rows[{i}] ({', '.join(BOOKS)}): "
                                   f"model {_books(rx)} != impl {_books(ry)}")
                continue
            out.append(f"queue[{q}].{f}: model {x} != impl {y}")
    for k, (a, b) in enumerate(zip(expected.slots, got.slots, strict=True)):
        if a[0] != b[0]:
            out.append(f"slots[{k}].content (device data): model {a[0]} != impl {b[0]}")
        if a[1] != b[1]:
            out.append(f"slots[{k}].released: model {a[1]} != impl {b[1]}")
    for r, (a, b) in enumerate(zip(expected.requests, got.requests, strict=True)):
        for f in ARequest._fields:
            if getattr(a, f) != getattr(b, f):
                out.append(f"requests[{r}].{f}: model {getattr(a, f)} != impl {getattr(b, f)}")
    return out


BOOKS = ("req", "pos", "prev_row", "live", "partial")
"""A row's fields that the host's books decide (the rest, `consumed`, is device data)."""


def _books(row: Row) -> tuple[object, ...]:
    return tuple(getattr(row, f) for f in BOOKS)

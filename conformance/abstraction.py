"""The abstraction function: what the implementation's state means in the model's vocabulary.

`abstract(view, reference)` maps a `Runner.abstract()` snapshot to an `Abstract` value, and
`project(state)` maps a model `State` to the same type; conformance after every step is
``abstract(runner) == project(model)``. The mapping, field by field:

=====================  ===========================================  ==============================
model                  implementation                               note
=====================  ===========================================  ==============================
allocated, next_slot   same fields                                  exact
queue[q].slot,         StepView.slot, src_slot, phase               exact; phases by name
src_slot, phase
queue[q].rows[i]       RowView(req, pos, prev_row, live)            a dropped row (live False)
                                                                    maps to the model's DEAD_ROW
queue[q].host_copy     StepView.host_copy (int ids)                 id -> token, below
slots[k]               SlotView(written, released)                  content None <-> not written;
                                                                    content itself: see below
requests[r]            RequestView(status, delivered, closed_at,    absent from the view = ABSENT;
                       unchecked, preemptions)                      statuses by name; delivered
                                                                    ids -> tokens
broken                 (ghost, no counterpart)                      checked as a model invariant
rows[i].consumed       (device-internal, not observed)              see below
=====================  ===========================================  ==============================

Tokens. The model's token ``(r, p)`` is "position p of request r's sequence". The probe model
makes that concrete: request r's sequence is `ProbeReference.sequence(prompt_r, ...)`, so an id
at position p maps to ``(r, p)`` when it equals the reference id there, and to GARBAGE
otherwise. The probe's step is a bijection of the input id at each position, so a stale input
can never yield the right id by chance: every wrong input the model would call garbage is
garbage here too.

Not observed, and why. ``consumed`` is the combine's output tensor and a slot's ``content`` is
the sampler's output: both live only on the device, and reading them from the host is exactly
the host read the design forbids between launch N and combine N+1 (it would also perturb the
emulated device's ordering). Their effect is observed one step later, value for value: a slot's
content reaches the host copy at ``readback_complete`` and the user at ``apply``, and a wrong
``consumed`` id yields a wrong sampled id there. So both are erased from the projection, and a
bug in them is caught where it becomes observable.
"""

from __future__ import annotations

from typing import NamedTuple

from ..impl import runner
from ..impl.runner import RowView, RunnerView
from ..model.state import GARBAGE, Phase, State, Status, Token

DEAD = (-1, 0, None, False)
"""The model's DEAD_ROW, projected: (req, pos, prev_row, live)."""


class AStep(NamedTuple):
    slot: int
    src_slot: int | None
    phase: str
    """The phase's name, shared by the model's `Phase` and the runner's."""
    rows: tuple[tuple[int, int, int | None, bool], ...]
    host_copy: tuple[Token, ...] | None


class ARequest(NamedTuple):
    status: str
    """The status's name, shared by the model's `Status` and the runner's."""
    delivered: tuple[Token, ...]
    closed_at: int | None
    unchecked: bool
    preemptions: int


class Abstract(NamedTuple):
    """The observable part of a state, shared by the model and the implementation."""

    allocated: bool
    next_slot: int
    queue: tuple[AStep, ...]
    slots: tuple[tuple[bool, bool], ...]
    """Per slot: (written, released)."""
    requests: tuple[ARequest, ...]


def project(s: State) -> Abstract:
    """The model state with the unobservable fields erased."""
    return Abstract(
        allocated=s.allocated,
        next_slot=s.next_slot,
        queue=tuple(
            AStep(
                slot=step.slot,
                src_slot=step.src_slot,
                phase=step.phase.name,
                rows=tuple(
                    (r.req, r.pos, r.prev_row, r.live) if r.live else DEAD for r in step.rows
                ),
                host_copy=step.host_copy,
            )
            for step in s.queue
        ),
        slots=tuple((slot.content is not None, slot.released) for slot in s.slots),
        requests=tuple(
            ARequest(r.status.name, r.delivered, r.closed_at, r.unchecked, r.preemptions)
            for r in s.requests
        ),
    )


def phase_name(phase: runner.Phase) -> str:
    """The model's phase of the same name (KeyError: the runner has a phase the model lacks)."""
    return Phase[phase.name].name


def status_name(status: runner.Status) -> str:
    """The model's status of the same name (KeyError: the runner has one the model lacks)."""
    return Status[status.name].name


def token(reference: list[int], req: int, pos: int, value: int) -> Token:
    """The model token for id `value` at position `pos` (1-based) of request `req`."""
    if 1 <= pos <= len(reference) and reference[pos - 1] == value:
        return (req, pos)
    return GARBAGE


def _row(row: RowView) -> tuple[int, int, int | None, bool]:
    return (row.req, row.pos, row.prev_row, True) if row.live else DEAD


def abstract(view: RunnerView, references: list[list[int]]) -> Abstract:
    """The implementation's state in the model's terms.

    `references[r]` is request r's reference sequence (ids at positions 1..n). A host copy's
    id in row i is position ``pos_i + 1`` of that row's request; a dead row's id is garbage,
    as the model forgets every token of a dropped row.
    """
    queue = []
    for step in view.queue:
        host_copy = None
        if step.host_copy is not None:
            host_copy = tuple(
                token(references[row.req], row.req, row.pos + 1, value) if row.live else GARBAGE
                for row, value in zip(step.rows, step.host_copy, strict=True)
            )
        queue.append(
            AStep(
                slot=step.slot,
                src_slot=step.src_slot,
                phase=phase_name(step.phase),
                rows=tuple(_row(row) for row in step.rows),
                host_copy=host_copy,
            )
        )
    requests = []
    for r in range(len(references)):
        rv = view.requests.get(r)
        if rv is None:
            requests.append(ARequest(Status.ABSENT.name, (), None, False, 0))
            continue
        delivered = tuple(token(references[r], r, i + 1, v) for i, v in enumerate(rv.delivered))
        requests.append(
            ARequest(status_name(rv.status), delivered, rv.closed_at, rv.unchecked,
                     rv.preemptions)
        )
    return Abstract(
        allocated=view.allocated,
        next_slot=view.next_slot,
        queue=tuple(queue),
        slots=tuple((s.written, s.released) for s in view.slots),
        requests=tuple(requests),
    )


def diff(expected: Abstract, got: Abstract) -> list[str]:
    """Readable differences, field by field (model first, implementation second)."""
    out: list[str] = []
    for name in ("allocated", "next_slot", "slots"):
        a, b = getattr(expected, name), getattr(got, name)
        if a != b:
            out.append(f"{name}: model {a} != impl {b}")
    if len(expected.queue) != len(got.queue):
        out.append(f"queue length: model {len(expected.queue)} != impl {len(got.queue)}")
    for q, (a, b) in enumerate(zip(expected.queue, got.queue, strict=False)):
        for field in AStep._fields:
            if getattr(a, field) != getattr(b, field):
                out.append(f"queue[{q}].{field}: model {getattr(a, field)} != impl "
                           f"{getattr(b, field)}")
    for r, (a, b) in enumerate(zip(expected.requests, got.requests, strict=True)):
        for field in ARequest._fields:
            if getattr(a, field) != getattr(b, field):
                out.append(f"requests[{r}].{field}: model {getattr(a, field)} != impl "
                           f"{getattr(b, field)}")
    return out

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
                       unchecked, preemptions, prefill_left,        statuses by name; delivered
                       placeholders, drafts_ready)                  ids -> tokens
broken                 (ghost, no counterpart)                      checked as a model invariant
=====================  ===========================================  ==============================

With drafts (spec rule 13, `drafted.py`), field by field:

=====================  ===========================================  ==============================
model                  implementation                               note
=====================  ===========================================  ==============================
rows[i].spec           Row.spec                                     exact (books)
rows[i].pos            delivered + the counts the request's rows    once the combine's ids exist;
                       of earlier in-flight steps wrote (device     -1 before, on both sides
                       data), as the model's `true_pos`
rows[i].placed         the combine's base position (device data);   a mirror row's: None until
                       before it exists, a host row's staged Row.pos  the base exists
rows[i].drafts         the combine's draft lanes (device data);     a mirror row's: None per lane
                       before a lane exists, a host row's staged    until it exists; ids ->
                       Row.drafts                                   proposals, below
queue[q].accepted      the launch's counts - 1 (device data)        once the count exists; a
                                                                    dropped row's is 0
queue[q].host_counts   StepView.host_counts                         a dropped row's is 0
slots[k].counts,       the slot's count and position (device        each once its command
positions              data)                                        completed
(content, counts)      the slot's run: its token lanes 0 .. count   once the count and those
                       - 1 (device data)                            lanes exist
drafts_after(content)  the slot's drafts (device data)              per lane, once it exists
=====================  ===========================================  ==============================

With state rows (spec rule 14), field by field:

=====================  ===========================================  ==============================
model                  implementation                               note
=====================  ===========================================  ==============================
rows[i].idx            Row.idx                                      exact (books)
requests[r].state_row  RequestView.state_row                        exact (books)
table[s].owner         RunnerView.table[s]                          exact (books)
table[s].newest        the table's newest ids at s (device data),   PENDING on both sides while a
                       as the batch row of the step that wrote it   launched step naming s has not
                       last: its next token (with drafts: count     completed its post-update;
                       tokens past its position)                    garbage if that row's request
                                                                    is not the owner, or was
                                                                    dropped since
table[s].position      with drafts, the table's positions at s      as newest; -1 without drafts
                       (device data)
=====================  ===========================================  ==============================

A slot row whose token is garbage (dropped, partial) is erased on both sides: nothing reads it.

No model variable is left unobserved on the emulated device or the cpu backend. On a chip there
is no view of device memory: the observer is absent, nothing counts as completed, and `consumed`
and `content` stay None / PENDING on both sides (the lockstep says so in its output).

Tokens. The model's token ``(r, p)`` is "position p of request r's sequence": position 0 is the
request's prompt id, and the probe's reference sequence (`ProbeReference.sequence`) gives the rest.
With drafts, the newest token of a row at position p that yielded c tokens is at p + c, and a
draft ``(r, p + j)`` after the newest token at p is the drafter's j-th proposal there
(`DraftReference.propose`, from the reference's token at p).
An id read for a row of request r at position p maps to ``(r, p)`` when it equals the reference
id there, to PLACEHOLDER when it is the host's placeholder (-1 as uint32), and to GARBAGE
otherwise. The probe's step is a bijection of the input id at each position, so a stale input
never yields the right id by chance. Slot content follows the model's `_drop`: a token of request
r in a slot written by step n is GARBAGE once r was finished, aborted or preempted (drop policy)
after step n was scheduled (its row was dropped, or its token scrubbed). A partial-prefill row's
sampled id is GARBAGE in the slot and the host copy: it is no token of the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ttmirror.conformance.lockstep import drafted
from ttmirror.conformance.lockstep.drafted import SlotRow
from ttmirror.conformance.lockstep.observe import Observed
from ttmirror.impl import rows, runner
from ttmirror.impl.drafts import DraftReference
from ttmirror.impl.runner import PLACEHOLDER_ID, RunnerView, StepView
from ttmirror.model.actions import DEAD_ROW
from ttmirror.model.state import (
    CLOSED,
    GARBAGE,
    PLACEHOLDER,
    Phase,
    Row,
    State,
    Status,
    Step,
    Token,
)

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
    accepted: tuple[int, ...] = ()
    """With drafts: per row the drafts its launch accepted, once the launch's counts exist."""
    host_counts: tuple[int, ...] = ()
    """With drafts: the readback's copy of the counts."""


class ARequest(NamedTuple):
    status: str
    """The status's name, shared by the model's `Status` and the runner's."""
    delivered: tuple[Token, ...]
    closed_at: int | None
    unchecked: bool
    preemptions: int
    prefill_left: int
    placeholders: int = 0
    drafts_ready: bool = False
    """Whether drafts follow its newest token; a closed request's is False (nothing reads it:
    the runner stops updating closed requests, the model at their next step)."""
    state_row: int = -1


class ATableRow(NamedTuple):
    """One state row (rule 14): its owner, and what the device holds there."""

    owner: int
    newest: Token | str
    """PENDING while a launched step that names it has not completed its post-update."""
    position: int | str


class ASlot(NamedTuple):
    content: Content
    released: bool
    rows: tuple[SlotRow, ...] | None = None
    """With drafts: what the slot holds per row beside its newest token; None without drafts or
    where the slot holds nothing (never written, released)."""


class Abstract(NamedTuple):
    """The observable part of a state, shared by the model and the implementation."""

    allocated: bool
    next_slot: int
    queue: tuple[AStep, ...]
    slots: tuple[ASlot, ...]
    requests: tuple[ARequest, ...]
    table: tuple[ATableRow, ...] = ()


class Seen(NamedTuple):
    """Which device effects have completed, by the model's names for them."""

    combined: frozenset[int] = frozenset()
    """Queue positions whose combine output exists on the device."""
    written: frozenset[int] = frozenset()
    """Slots whose current writer's sampler has completed (with drafts: and its count)."""
    lanes: frozenset[tuple[int, str]] = frozenset()
    """With drafts: (queue position, part) of each other combine output that exists: the draft
    lanes ("lane1"..) and the base positions ("base")."""
    parts: frozenset[tuple[int, str]] = frozenset()
    """With drafts: (slot, part) of each part of a slot's draft part ("count", "position",
    "tokens0".., "drafts0"..) that its writer wrote, or a later step overwrote."""
    counted: frozenset[int] = frozenset()
    """With drafts: queue positions whose launch's counts exist."""
    scattered: frozenset[tuple[int, str]] = frozenset()
    """With state rows: (queue position, part) of each table part its post-update wrote."""


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
    """(request, steps scheduled so far) at each finish, abort or preemption (drop policy), and
    with drafts at each apply that finished a request with a later row in flight."""
    prefill_chunks: int = 1
    spec: int = 0
    """K: the spec tokens of each decoding row's drafts (0: no drafts)."""
    drafter: DraftReference | None = None
    """With drafts: the run's drafter, whose proposals the draft ids are."""
    state_rows: bool = False
    """Per-request state rows (rule 14): positions are the table's, not the slots'."""
    truths: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """With drafts: step number -> each row's position, fixed once its combine's ids exist."""
    proposals: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)
    """Cache: (req, pos) -> the drafter's K proposals after the token at pos."""

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

    # --- with drafts --------------------------------------------------------------------------
    def proposal(self, req: int, pos: int, lane: int) -> int | None:
        """The drafter's proposal for position pos + lane after `req`'s token at `pos`."""
        chain = self.proposals.get((req, pos))
        if chain is None:
            newest = self.id_at(req, pos)
            chain = () if newest is None or self.drafter is None else self.drafter.propose(
                newest, pos)
            self.proposals[(req, pos)] = chain
        return chain[lane - 1] if 1 <= lane <= len(chain) else None

    def draft_token(self, req: int, pos: int, lane: int, value: int) -> Token:
        """The model token for a draft id `value` in lane `lane` after `req`'s token at `pos`:
        the drafter's proposal for pos + lane, the host's placeholder, or garbage."""
        if pos >= 0 and value == self.proposal(req, pos, lane):
            return (req, pos + lane)
        return PLACEHOLDER if value & UINT32 == PLACEHOLDER_ID & UINT32 else GARBAGE

    def right(self, req: int, pos: int) -> bool:
        """Is the drafter's proposal after `req`'s token at `pos` the token at pos + 1 (the
        target verifies it: the probe's tokens are plain decoding's)?"""
        after = self.id_at(req, pos + 1)
        return after is not None and self.proposal(req, pos, 1) == after

    def truth(self, step: int, row: int) -> int:
        """With drafts: row `row` of step number `step`'s position, -1 while unknown."""
        known = self.truths.get(step)
        return known[row] if known is not None else -1

    def learn(self, view: RunnerView, observed: Observed | None) -> None:
        """With drafts: fix the positions of each in-flight step whose combine's ids exist."""
        if not self.spec or observed is None:
            return
        for q, step in enumerate(view.queue):
            if step.n not in self.truths and step.n in observed.consumed:
                known = drafted.positions(view, observed, q)
                if known is not None:
                    self.truths[step.n] = known


def project(s: State, seen: Seen, spec: int = 0) -> Abstract:
    """The model state as the implementation can show it once `seen` effects completed."""
    queue = []
    for q, step in enumerate(s.queue):
        combined = q in seen.combined
        rows_ = tuple(
            DEAD if not r.live else drafted.project_row(r, q, seen) if spec
            else r if combined else r._replace(consumed=None)
            for r in step.rows
        )
        accepted: tuple[int, ...] = ()
        host_counts: tuple[int, ...] = ()
        if spec:
            if q in seen.counted and step.accepted:
                accepted = drafted.masked(step.rows, step.accepted)
            host_counts = drafted.masked(step.rows, step.host_counts)
        queue.append(AStep(slot=step.slot, src_slot=step.src_slot, phase=step.phase.name,
                           rows=rows_, host_copy=step.host_copy, accepted=accepted,
                           host_counts=host_counts))
    slots = []
    for k, slot in enumerate(s.slots):
        content: Content = slot.content
        if content and not slot.released and k not in seen.written:
            content = PENDING
        part = drafted.project_slot(slot, k, seen, spec) if spec else None
        slots.append(ASlot(content, slot.released, part))
    writers = _writers(s.queue)
    table = []
    for idx, row in enumerate(s.table):
        newest: Token | str = row.newest
        position: int | str = row.position
        if _pending(idx, writers, seen, "newest"):
            newest = PENDING
        if spec and _pending(idx, writers, seen, "position"):
            position = PENDING
        table.append(ATableRow(row.owner, newest, position))
    return Abstract(
        allocated=s.allocated,
        next_slot=s.next_slot,
        queue=tuple(queue),
        slots=tuple(slots),
        requests=tuple(
            ARequest(r.status.name, r.delivered, r.closed_at, r.unchecked, r.preemptions,
                     r.prefill_left, r.placeholders, r.drafts_ready and r.status not in CLOSED,
                     r.state_row)
            for r in s.requests
        ),
        table=tuple(table),
    )


def _writers(queue: Sequence[Step | StepView]) -> list[tuple[int, tuple[int, ...]]]:
    """Each launched in-flight step's queue position and idx_mapping (the model's and the
    runner's phases share their numbering)."""
    return [(q, tuple(r.idx for r in step.rows)) for q, step in enumerate(queue)
            if step.phase >= Phase.LAUNCHED]


def _pending(idx: int, writers: list[tuple[int, tuple[int, ...]]], seen: Seen,
             part: str) -> bool:
    """Does the newest launched step naming state row `idx` (of `writers`: queue position and
    idx_mapping of each launched in-flight step) still have to write table `part` there? Post-
    updates complete in queue order, so the newest one's is the one to wait for."""
    last = next((q for q, idx_mapping in reversed(writers) if idx in idx_mapping), None)
    return last is not None and (last, part) not in seen.scattered


def seen_in(view: RunnerView, observed: Observed | None) -> Seen:
    """Which effects of the runner's in-flight steps and slots the device has completed."""
    if observed is None:
        return Seen()
    combined = frozenset(q for q, step in enumerate(view.queue) if step.n in observed.consumed)
    written = frozenset(
        k for k, slot in enumerate(view.slots)
        if slot.writer is not None and observed.content.get(k, (None, ()))[0] == slot.writer
    )
    scattered = frozenset((q, part) for q, step in enumerate(view.queue)
                          for part in observed.scattered.get(step.n, ()))
    if not observed.drafts:
        return Seen(combined, written, scattered=scattered)
    lanes = frozenset((q, part) for q, step in enumerate(view.queue)
                      for part in observed.lanes.get(step.n, {}))
    parts = frozenset(
        (k, part) for k, slot in enumerate(view.slots) if slot.writer is not None
        for part, (writer, _) in observed.parts.get(k, {}).items() if writer >= slot.writer
    )
    # With drafts the newest token's position depends on the count: the two are read together.
    written = frozenset(k for k in written if (k, "count") in parts)
    counted = frozenset(q for q, step in enumerate(view.queue) if step.n in observed.counts)
    return Seen(combined, written, lanes, parts, counted, scattered)


def abstract(view: RunnerView, context: Context, observed: Observed | None, seen: Seen
             ) -> Abstract:
    """The implementation's state in the model's terms (see the tables above)."""
    context.learn(view, observed)
    spec = context.spec
    queue = []
    for q, step in enumerate(view.queue):
        consumed = observed.consumed.get(step.n) if observed and q in seen.combined else None
        host_copy = None
        if step.host_copy is not None:
            host_copy = tuple(
                _read_back(context, step.n, i, row, value, step.host_counts)
                for i, (row, value) in enumerate(zip(step.rows, step.host_copy, strict=True))
            )
        accepted: tuple[int, ...] = ()
        if spec and observed is not None and q in seen.counted:
            accepted = drafted.masked(step.rows, tuple(
                c - 1 for c in observed.counts[step.n][: len(step.rows)]))
        queue.append(AStep(
            slot=step.slot,
            src_slot=step.src_slot,
            phase=phase_name(step.phase),
            rows=tuple(
                DEAD if not row.live
                else drafted.row_of(row, q, step.n, i, context, observed, seen) if spec
                else _row(context, row, consumed, i)
                for i, row in enumerate(step.rows)),
            host_copy=host_copy,
            accepted=accepted,
            host_counts=drafted.masked(step.rows, step.host_counts) if spec else (),
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
                content = (drafted.content_of(context, observed, k, writer, ids) if spec
                           else _content(context, writer, ids))
        part = drafted.slot_of(k, slot, context, observed, seen) if spec else None
        slots.append(ASlot(content, slot.released, part))
    requests = []
    for r in range(len(context.prompts)):
        rv = view.requests.get(r)
        if rv is None:
            requests.append(ARequest(Status.ABSENT.name, (), None, False, 0,
                                     context.prefill_chunks - 1))
            continue
        delivered = tuple(context.token(r, i + 1, v) for i, v in enumerate(rv.delivered))
        requests.append(ARequest(status_name(rv.status), delivered, rv.closed_at, rv.unchecked,
                                 rv.preemptions, rv.prefill_left, rv.placeholders,
                                 rv.drafts_ready and rv.status not in runner.CLOSED,
                                 rv.state_row))
    return Abstract(view.allocated, view.next_slot, tuple(queue), tuple(slots), tuple(requests),
                    _table(view, context, observed, seen))


def _table(view: RunnerView, context: Context, observed: Observed | None, seen: Seen
           ) -> tuple[ATableRow, ...]:
    """The state rows as the model's (see the table above): owners from the books, newest tokens
    and positions from the device's table as the step that last named each row wrote it."""
    writers = _writers(view.queue)
    written = observed.table if observed is not None else {}
    out = []
    for idx, owner in enumerate(view.table):
        newest: Token | str = GARBAGE
        position: int | str = -1
        if owner < 0:
            out.append(ATableRow(owner, newest, position))
            continue
        if _pending(idx, writers, seen, "newest"):
            newest = PENDING
        elif (found := written.get("newest", {}).get(idx)) is not None:
            newest = _state_token(context, observed, owner, *found)
        if context.spec and _pending(idx, writers, seen, "position"):
            position = PENDING
        elif context.spec and (found := written.get("position", {}).get(idx)) is not None:
            step, i, value = found
            if _owners_token(context, owner, step, i):
                position = value
        out.append(ATableRow(owner, newest, position))
    return tuple(out)


def _owners_token(context: Context, owner: int, step: int, i: int) -> bool:
    """Did batch row i of step number `step` scatter a token of `owner`'s: its row (-1: no row
    named the state row), not a partial prefill's, and not dropped since (the model forgets a
    dropped request's state)?"""
    if i < 0:
        return False  # changed by a post-update whose rows do not name it
    req, _ = context.layouts[step][i]
    return req == owner and not context.dropped_since(req, step) and i not in (
        context.partials.get(step, frozenset()))


def _state_token(context: Context, observed: Observed | None, owner: int, step: int, i: int,
                 value: int) -> Token:
    """The token batch row i of step number `step` scattered into a state row `owner` holds:
    its next token (with drafts, count tokens past its position); garbage where it is not the
    owner's (`_owners_token`)."""
    if not _owners_token(context, owner, step, i):
        return GARBAGE
    req, pos = context.layouts[step][i]
    if not context.spec:
        return context.token(req, pos + 1, value)
    counts = observed.counts.get(step) if observed is not None else None
    if counts is None or context.truth(step, i) < 0:
        return GARBAGE
    return context.token(req, context.truth(step, i) + counts[i], value)


def _read_back(context: Context, step: int, i: int, row: rows.Row, value: int,
               counts: tuple[int, ...]) -> Token:
    """A host copy's id as a token: the row's next token; with drafts, its newest, count tokens
    past its position."""
    if not row.live or row.partial:
        return GARBAGE
    if context.spec:
        return context.token(row.req, context.truth(step, i) + counts[i], value)
    return context.token(row.req, row.pos + 1, value)


def _row(context: Context, row: rows.Row, consumed: tuple[int, ...] | None, i: int) -> Row:
    """The implementation's live row as the model's: the consumed id, when seen, as a token."""
    token = None if consumed is None else context.token(row.req, row.pos, consumed[i])
    return Row(req=row.req, pos=row.pos, prev_row=row.prev_row, consumed=token, live=True,
               partial=row.partial, idx=row.idx)


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


def diff(expected: Abstract, got: Abstract, seen: Seen | None = None, spec: int = 0
         ) -> list[str]:
    """Readable differences, field by field (model first, implementation second): the queue
    first, so a combine's output is named before the slot the sampler then wrote from it;
    `seen` labels the drafts' row fields that are device data (`spec`: K)."""
    seen = seen or Seen()
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
                    out.extend(_row_diff(q, i, rx, ry, seen, spec))
                continue
            label = " (device data)" if f == "accepted" else ""
            out.append(f"queue[{q}].{f}{label}: model {x} != impl {y}")
    for k, (a, b) in enumerate(zip(expected.slots, got.slots, strict=True)):
        if a.content != b.content:
            out.append(f"slots[{k}].content (device data): model {a.content} != impl {b.content}")
        if a.released != b.released:
            out.append(f"slots[{k}].released: model {a.released} != impl {b.released}")
        if a.rows != b.rows:
            out.extend(drafted.slot_diff(k, a.rows, b.rows))
    for r, (a, b) in enumerate(zip(expected.requests, got.requests, strict=True)):
        for f in ARequest._fields:
            if getattr(a, f) != getattr(b, f):
                out.append(f"requests[{r}].{f}: model {getattr(a, f)} != impl {getattr(b, f)}")
    if len(expected.table) != len(got.table):
        out.append(f"table: model {len(expected.table)} state rows != impl {len(got.table)}")
    for idx, (a, b) in enumerate(zip(expected.table, got.table, strict=False)):
        for f in ATableRow._fields:
            if getattr(a, f) != getattr(b, f):
                label = "" if f == "owner" else " (device data)"
                out.append(f"table[{idx}].{f}{label}: model {getattr(a, f)} != impl "
                           f"{getattr(b, f)}")
    return out


BOOKS = ("req", "pos", "prev_row", "live", "partial", "idx")
"""A row's fields that the host's books decide (the rest, `consumed`, is device data)."""
SPEC_BOOKS = ("req", "prev_row", "live", "partial", "spec", "idx")
"""With drafts: a row's fields that the host's books decide (its position is the device's)."""


def _row_diff(q: int, i: int, rx: Row, ry: Row, seen: Seen, spec: int) -> list[str]:
    out = []
    if rx.consumed != ry.consumed:
        out.append(f"queue[{q}].rows[{i}].consumed (device data): model {rx.consumed} != impl "
                   f"{ry.consumed}")
    books = SPEC_BOOKS if spec else BOOKS
    x, y = _books(rx, books), _books(ry, books)
    if x != y:
        out.append(f"queue[{q}].rows[{i}] ({', '.join(books)}): model {x} != impl {y}")
    for f in drafted.ROW_FIELDS if spec else ():
        x, y = getattr(rx, f), getattr(ry, f)
        if x != y:
            label = " (device data)" if drafted.seen_part(f, q, seen) else ""
            out.append(f"queue[{q}].rows[{i}].{f}{label}: model {x} != impl {y}")
    return out


def _books(row: Row, books: tuple[str, ...]) -> tuple[object, ...]:
    return tuple(getattr(row, f) for f in books)

"""The inductive invariant: the model's safety invariants, in the solver's vocabulary, and the
strengthening conjuncts they need to be preserved by every action from every state that
satisfies them all, whatever the number of requests, rows, slots, tokens and steps.

Each conjunct is a function of one state with a one-line docstring that says what it means; the
safety invariants carry the names of `model/invariants.py`. Queue places are the D places of the
in-flight queue (0 = oldest); rows range over a step's rows, requests over 0..N-1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..model.state import Phase, Status
from .relation import (
    Ctx,
    counts_row,
    eligible,
    has_row,
    in_flight,
    in_range,
    inputs_right,
    is_writer,
    live,
    mirror_row,
    newest_on_device,
    read_slot,
    ring,
    true_pos,
    yielded,
)
from .symbolic import NONE_INT, StateV, StepV, Term

_W, _R, _P, _F = (int(Status.WAITING), int(Status.RUNNING), int(Status.PREEMPTED),
                  int(Status.FAILED))
_CLOSED = (int(Status.FINISHED), int(Status.ABORTED), int(Status.FAILED))
_SCHED, _COMB, _LAUNCH, _RI, _RD = (int(p) for p in Phase)


def _rows(c: Ctx, s: StateV, q: int, body: Callable[[Term], Term]) -> Term:
    """Queue place q holds a step, and body(i) holds for each of its rows i."""
    z, st = c.smt.z, s.queue[q]
    return z.Implies(q < s.qlen, c.forall(lambda i: z.Implies(z.And(i >= 0, i < st.nrows),
                                                              body(i))))


def _live_rows(c: Ctx, s: StateV, body: Callable[[int, Term, Term], Term]) -> Term:
    """body(q, i, r) for every live row i of every in-flight step q, r its request."""
    z = c.smt.z

    def place(q: int) -> Term:
        st = s.queue[q]
        return _rows(c, s, q, lambda i: z.Implies(live(st, i), body(q, i, st.req[i])))

    return z.And(*[place(q) for q in range(c.opts.depth)])


def _requests(c: Ctx, body: Callable[[Term], Term]) -> Term:
    """body(r) for every request r."""
    z = c.smt.z
    return c.forall(lambda r: z.Implies(in_range(c, r), body(r)))


# ---------------------------------------------------------------------------------------------
# The safety invariants (model/invariants.py).


def stale_host_ids_guard(c: Ctx, s: StateV) -> Term:
    """#323-class: every combined live row consumed exactly its request's newest token, and with
    drafts its true position and the drafter's proposals after it."""
    z, smt = c.smt.z, c.smt

    def right(q: int, i: Term, r: Term) -> Term:
        st = s.queue[q]
        if c.opts.spec_tokens:
            return inputs_right(c, st, i)
        return st.consumed[i] == smt.tok(r, st.pos[i])

    return _live_rows(c, s, lambda q, i, r: z.Implies(s.queue[q].phase >= _COMB,
                                                      right(q, i, r)))


def no_read_of_released_or_overwritten_slot(c: Ctx, s: StateV) -> Term:
    """No combine or readback ever read a slot that was handed back or rewritten under it."""
    return c.smt.z.Not(s.broken_read)


def no_rewrite_while_reader_outstanding(c: Ctx, s: StateV) -> Term:
    """No launch ever wrote a slot whose readback or next combine was still to happen."""
    return c.smt.z.Not(s.broken_rewrite)


def depth_bound(c: Ctx, s: StateV) -> Term:
    """At most D = max_concurrent_batches steps are in flight."""
    return s.qlen <= c.opts.depth


def output_integrity(c: Ctx, s: StateV) -> Term:
    """Per request, the user got tokens 1..n in order, each once, none past its close or
    max."""
    z, smt, rq = c.smt.z, c.smt, s.requests

    def request(r: Term) -> Term:
        n, closed = rq.ndelivered[r], rq.closed_at[r]
        tokens = c.forall(lambda i: z.Implies(z.And(i >= 0, i < n),
                                              rq.delivered[r][i] == smt.tok(r, i + 1)))
        status = rq.status[r]
        return z.And(n >= 0, tokens, n <= c.params.M[r],
                     z.Implies(closed != NONE_INT, n == closed),
                     z.Implies(z.Or(*[status == x for x in _CLOSED]), closed != NONE_INT))

    return _requests(c, request)


def failed_requests_quiet(c: Ctx, s: StateV) -> Term:
    """A failed request has no live row in flight."""
    return _live_rows(c, s, lambda q, i, r: s.requests.status[r] != _F)


def newest_token_in_newest_step(c: Ctx, s: StateV) -> Term:
    """A request the next step would combine from the mirror has its newest token in the newest
    in-flight step: the one slot that combine reads, at any depth."""
    z = c.smt.z
    if not c.opts.guard or c.opts.subsets:  # the ring's lemma without subsets only
        return z.BoolVal(True)
    cases = []
    for n in range(1, c.opts.depth + 1):
        newest = s.queue[n - 1]

        def holds(r: Term, n: int = n, newest: object = newest) -> Term:
            anywhere = z.Or(*[mirror_row(c, s.queue[q], r) >= 0 for q in range(n)])
            applies = z.And(eligible(c, s, r), s.requests.status[r] != _W,
                            z.Not(c.params.HS[r]))
            return z.Implies(z.And(applies, anywhere), mirror_row(c, s.queue[n - 1], r) >= 0)

        cases.append(z.Implies(s.qlen == n, _requests(c, holds)))
    return z.And(*cases)


# ---------------------------------------------------------------------------------------------
# Strengthening conjuncts.


def well_formed(c: Ctx, s: StateV) -> Term:
    """The queue length, the ring position, each in-flight step's slot, source slot, phase and
    row count, and each request's status are in range; a step has a host copy exactly once it
    was read back."""
    z = c.smt.z
    steps = []
    for q, st in enumerate(s.queue):
        steps.append(z.Implies(q < s.qlen, z.And(
            st.slot >= 0, st.slot < c.params.K, st.nrows >= 1,
            st.phase >= _SCHED, st.phase <= _RD,
            z.Or(st.src == NONE_INT, st.src == ring(c, st.slot - 1)),
            st.has_host_copy == (st.phase == _RD))))
    rq = s.requests
    requests = _requests(c, lambda r: z.And(rq.status[r] >= int(Status.ABSENT),
                                            rq.status[r] <= int(Status.FAILED),
                                            rq.ndelivered[r] >= 0))
    return z.And(s.qlen >= 0, s.next_slot >= 0, s.next_slot < c.params.K, *steps, requests)


def closed_at_only_when_closed(c: Ctx, s: StateV) -> Term:
    """A request has a closing count only once it is closed (finished, aborted or failed)."""
    z, rq = c.smt.z, s.requests
    return _requests(c, lambda r: z.Implies(
        rq.closed_at[r] != NONE_INT, z.Or(*[rq.status[r] == x for x in _CLOSED])))


def slots_consecutive(c: Ctx, s: StateV) -> Term:
    """The in-flight steps hold the ring slots just before the next one, in queue order."""
    z = c.smt.z
    return z.And(*[z.Implies(q < s.qlen, st.slot == ring(c, s.next_slot - s.qlen + q))
                   for q, st in enumerate(s.queue)])


def phases_ordered(c: Ctx, s: StateV) -> Term:
    """A step is combined only once the step before it has launched."""
    z = c.smt.z
    return z.And(*[z.Implies(z.And(q < s.qlen, s.queue[q].phase >= _COMB),
                             s.queue[q - 1].phase >= _LAUNCH)
                   for q in range(1, c.opts.depth)])


def rows_name_requests(c: Ctx, s: StateV) -> Term:
    """Each row names a request or is dropped, each request has at most one live row per step,
    and the request-to-row index is the inverse of the rows."""
    z = c.smt.z

    def place(q: int, st: StepV) -> Term:
        rows = _rows(c, s, q, lambda i: z.And(
            st.req[i] >= -1, st.req[i] < c.params.N,
            z.Implies(st.req[i] >= 0, st.row_of[st.req[i]] == i)))
        index = z.Implies(q < s.qlen, _requests(c, lambda r: z.And(
            st.row_of[r] >= -1, st.row_of[r] < st.nrows,
            z.Implies(st.row_of[r] >= 0, st.req[st.row_of[r]] == r))))
        return z.And(rows, index)

    return z.And(*[place(q, st) for q, st in enumerate(s.queue)])


def live_rows_active(c: Ctx, s: StateV) -> Term:
    """A live row's request is waiting, running or preempted: never absent or closed."""
    z = c.smt.z

    def active(q: int, i: Term, r: Term) -> Term:
        st = s.requests.status[r]
        return z.Or(st == _W, st == _R, st == _P)

    return _live_rows(c, s, active)


def waiting_owes_nothing(c: Ctx, s: StateV) -> Term:
    """A waiting request has no token in flight (it arrived, or resumed once it owned no
    placeholder)."""
    z = c.smt.z
    return _requests(c, lambda r: z.Implies(s.requests.status[r] == _W,
                                            in_flight(c, s, r) == 0))


def prefill_before_tokens(c: Ctx, s: StateV) -> Term:
    """While prompt chunks remain, the request has no token in flight and none delivered."""
    z = c.smt.z
    rq = s.requests
    return _requests(c, lambda r: z.And(
        rq.prefill_left[r] >= 0,
        z.Implies(rq.prefill_left[r] > 0, z.And(in_flight(c, s, r) == 0,
                                                rq.ndelivered[r] == 0))))


def within_budget(c: Ctx, s: StateV) -> Term:
    """Delivered tokens plus those in flight never exceed the request's max tokens."""
    return _requests(c, lambda r: s.requests.ndelivered[r] + in_flight(c, s, r)
                     <= c.params.M[r])


def positions_consecutive(c: Ctx, s: StateV) -> Term:
    """A live row's position is its request's delivered tokens plus the tokens its rows in the
    older in-flight steps will deliver; with drafts, -1 until its combine, then the delivered
    tokens plus what the older steps' launches yielded."""
    z = c.smt.z
    if not c.opts.spec_tokens:
        return _live_rows(c, s, lambda q, i, r: s.queue[q].pos[i]
                          == s.requests.ndelivered[r] + in_flight(c, s, r, before=q))
    return _live_rows(c, s, lambda q, i, r: s.queue[q].pos[i] == z.If(
        s.queue[q].phase >= _COMB, true_pos(c, s, q, r), -1))


def host_rows_owe_nothing(c: Ctx, s: StateV) -> Term:
    """A live row that reads host ids has no token of its request in flight before it."""
    z = c.smt.z
    return _live_rows(c, s, lambda q, i, r: z.Implies(
        s.queue[q].prev[i] == NONE_INT, in_flight(c, s, r, before=q) == 0))


def mirror_rows_follow(c: Ctx, s: StateV) -> Term:
    """A live row still to combine from the mirror points at its request's token-yielding row
    in the step before, through that step's slot; once that step launched, the slot holds the
    row's newest token there."""
    z, smt = c.smt.z, c.smt

    def follows(q: int, i: Term, r: Term) -> Term:
        st = s.queue[q]
        p = st.prev[i]
        back = []
        if q >= 1:
            before = s.queue[q - 1]
            back = [st.src == before.slot, before.req[p] == r, z.Not(before.partial[p]),
                    p >= 0, p < before.nrows]
        written = z.Or(q == 0, s.queue[q - 1].phase >= _LAUNCH) if q else z.BoolVal(True)
        newest: list[Term] = [read_slot(c, s, st.src, p) == smt.tok(r, st.pos[i])]
        if c.opts.spec_tokens:  # the newest token and its position, both on the device
            truth = true_pos(c, s, q, r)
            newest = [read_slot(c, s, st.src, p) == smt.tok(r, truth),
                      p < s.slots.ncounts[st.src], s.slots.positions[st.src][p] == truth]
        return z.Implies(z.And(st.phase == _SCHED, p != NONE_INT), z.And(
            p >= 0, st.src != NONE_INT, *back, z.Implies(written, z.And(*newest))))

    return _live_rows(c, s, follows)


def launched_slot_holds_tokens(c: Ctx, s: StateV) -> Term:
    """A launched in-flight step's slot is written, not handed back, as long as its rows, and
    holds each token-yielding row's next token."""
    z, smt = c.smt.z, c.smt
    sl = s.slots

    def place(q: int, st: StepV) -> Term:
        k = st.slot
        held = z.And(z.Not(sl.unwritten[k]), z.Not(sl.released[k]), sl.length[k] == st.nrows,
                     is_writer(c, s, k, q))

        def row(i: Term) -> Term:
            if not c.opts.spec_tokens:
                return sl.content[k][i] == smt.tok(st.req[i], st.pos[i] + 1)
            n = st.accepted[i] + 1
            # With state rows the positions live in the table (StateRowsHoldNewest), not here.
            placed = sl.positions[k][i] == st.pos[i] + n if not c.opts.rows else True
            return z.And(st.accepted[i] >= 0, st.accepted[i] <= st.spec[i],
                         sl.content[k][i] == smt.tok(st.req[i], st.pos[i] + n),
                         sl.counts[k][i] == n, placed)

        if c.opts.spec_tokens:
            held = z.And(held, sl.ncounts[k] == st.nrows, st.has_accepted)
        tokens = _rows(c, s, q, lambda i: z.Implies(
            z.And(live(st, i), z.Not(st.partial[i])), row(i)))
        return z.Implies(z.And(q < s.qlen, st.phase >= _LAUNCH), z.And(held, tokens))

    return z.And(*[place(q, st) for q, st in enumerate(s.queue)])


def host_copy_holds_tokens(c: Ctx, s: StateV) -> Term:
    """A read-back step's host copy holds each token-yielding row's next token."""
    z, smt = c.smt.z, c.smt

    def row(st: StepV, i: Term) -> Term:
        if not c.opts.spec_tokens:
            return st.host_copy[i] == smt.tok(st.req[i], st.pos[i] + 1)
        n = st.accepted[i] + 1
        return z.And(st.host_copy[i] == smt.tok(st.req[i], st.pos[i] + n),
                     st.host_counts[i] == n)

    def place(q: int, st: StepV) -> Term:
        read = z.And(st.has_host_counts, st.has_accepted) if c.opts.spec_tokens else True
        return z.Implies(z.And(q < s.qlen, st.phase == _RD), z.And(read, _rows(
            c, s, q, lambda i: z.Implies(z.And(live(st, i), z.Not(st.partial[i])), row(st, i)))))

    return z.And(*[place(q, st) for q, st in enumerate(s.queue)])


def placeholders_count_rows(c: Ctx, s: StateV) -> Term:
    """With drafts: a request's placeholders are 1 + spec for each of its token-yielding rows in
    flight."""
    z = c.smt.z

    def owed(r: Term) -> Term:
        return z.Sum(0, *[z.If(counts_row(c, s, q, r), 1 + st.spec[st.row_of[r]], 0)
                          for q, st in enumerate(s.queue)])

    return _requests(c, lambda r: s.requests.placeholders[r] == owed(r))


def host_rows_staged(c: Ctx, s: StateV) -> Term:
    """With drafts: a live row carries 0..K drafts; one still to combine from host ids was staged
    at the request's delivered count, with the drafter's proposals after its newest token; a
    mirror row's position and drafts are still to come from the device."""
    z, smt = c.smt.z, c.smt

    def staged(q: int, i: Term, r: Term) -> Term:
        st = s.queue[q]
        nd = s.requests.ndelivered[r]
        drafts = [z.Implies(j < st.spec[i], st.drafts[i][j] == smt.tok(r, nd + j + 1))
                  for j in range(c.opts.spec_tokens)]
        host = z.And(st.placed[i] == nd, st.ndrafts[i] == st.spec[i], *drafts)
        mirror = z.And(st.placed[i] == NONE_INT, st.ndrafts[i] == 0)
        spec = z.And(st.spec[i] >= 0, st.spec[i] <= c.opts.spec_tokens)
        return z.And(spec, z.Implies(st.phase == _SCHED,
                                     z.If(st.prev[i] == NONE_INT, host, mirror)))

    return _live_rows(c, s, staged)


# --- per-request state rows (spec rule 14) ---------------------------------------------------


def _active(c: Ctx, s: StateV, r: Term) -> Term:
    st = s.requests.status[r]
    return c.smt.z.Or(st == _W, st == _R, st == _P)


def no_write_to_unheld_state_row(c: Ctx, s: StateV) -> Term:
    """No launch ever scattered a row into a state row its request no longer held."""
    return c.smt.z.Not(s.broken_unheld)


def state_rows_owned(c: Ctx, s: StateV) -> Term:
    """Each arrived, unreleased request owns exactly the state row it names, and each owned
    state row names its owner."""
    z, rq, tb = c.smt.z, s.requests, s.table

    def request(r: Term) -> Term:
        sr = rq.state_row[r]
        absent = rq.status[r] == int(Status.ABSENT)
        return z.And(z.Implies(_active(c, s, r), sr >= 0), z.Implies(absent, sr == -1),
                     z.Implies(sr >= 0, z.And(sr < c.params.S, tb.owner[sr] == r)))

    rows = c.forall(lambda k: z.Implies(z.And(k >= 0, k < c.params.S, tb.owner[k] >= 0), z.And(
        tb.owner[k] < c.params.N, rq.state_row[tb.owner[k]] == k)))
    return z.And(_requests(c, request), rows)


def _launched_sum(c: Ctx, s: StateV, r: Term) -> Term:
    """The tokens ``r``'s launched in-flight rows yielded (one each without drafts)."""
    z = c.smt.z
    terms = []
    for q, st in enumerate(s.queue):
        launched = z.And(q < s.qlen, st.phase >= _LAUNCH)
        each = yielded(c, s, q, r) if c.opts.spec_tokens else z.If(counts_row(c, s, q, r), 1, 0)
        terms.append(z.If(launched, each, 0))
    return z.Sum(0, *terms)


def newest_token_in_state_row(c: Ctx, s: StateV) -> Term:
    """A request whose in-flight steps have all launched holds its newest token in its state row
    (and with drafts its position): what its next combine gathers, however many steps ago it
    ran."""
    z, smt, rq = c.smt.z, c.smt, s.requests
    if not c.opts.guard:
        return z.BoolVal(True)

    def holds(r: Term) -> Term:
        sr = rq.state_row[r]
        all_launched = z.And(*[z.Implies(has_row(c, s, q, r), st.phase >= _LAUNCH)
                               for q, st in enumerate(s.queue)])
        newest = smt.tok(r, rq.ndelivered[r] + _launched_sum(c, s, r))
        applies = z.And(sr >= 0, _active(c, s, r), newest_on_device(c, s, r), all_launched)
        return z.Implies(applies, s.table.newest[sr] == newest)

    return _requests(c, holds)


def rows_hold_their_state_row(c: Ctx, s: StateV) -> Term:
    """With state rows: every in-flight row, dropped or not, names a state row its request (the
    one it was scheduled for) still owns, a live row its request's own; no two rows of a step
    name one state row, and the step's inverse index finds each."""
    z = c.smt.z

    def place(q: int, st: StepV) -> Term:
        rows = _rows(c, s, q, lambda i: z.And(
            st.idx[i] >= 0, st.idx[i] < c.params.S, st.was[i] >= 0, st.was[i] < c.params.N,
            s.table.owner[st.idx[i]] == st.was[i], st.row_at[st.idx[i]] == i,
            z.Implies(live(st, i), z.And(st.was[i] == st.req[i],
                                         st.idx[i] == s.requests.state_row[st.req[i]])),
            z.Implies(st.prev[i] != NONE_INT, st.prev[i] == st.idx[i])))
        inverse = c.forall(lambda k: z.Implies(
            z.And(k >= 0, k < c.params.S, st.row_at[k] >= 0),
            z.And(st.row_at[k] < st.nrows, st.idx[st.row_at[k]] == k)))
        return z.And(rows, z.Implies(q < s.qlen, inverse))

    return z.And(*[place(q, st) for q, st in enumerate(s.queue)])


def dropped_rows_first(c: Ctx, s: StateV) -> Term:
    """With state rows: of the in-flight rows naming one state row, the dropped ones are in
    older steps than the live ones, so a live row's scatter is the last."""
    z = c.smt.z
    out = []
    for q, st in enumerate(s.queue):
        for q2 in range(q + 1, c.opts.depth):
            later = s.queue[q2]

            def fine(i: Term, st: StepV = st, later: StepV = later, q2: int = q2) -> Term:
                j = later.row_at[st.idx[i]]
                return z.Implies(z.And(q2 < s.qlen, live(st, i), j >= 0), live(later, j))

            out.append(_rows(c, s, q, fine))
    return z.And(*out)


def device_rows_over_live_rows(c: Ctx, s: StateV) -> Term:
    """With state rows: a live row still to combine from its state row has, after any dropped
    row naming that state row or partial row of its request in an older step, a token-yielding
    row of its request in a step between (it was scheduled while its request's token was in
    flight; a drop since would have dropped it too)."""
    z = c.smt.z
    out = []
    for q, st in enumerate(s.queue):
        def fine(i: Term, st: StepV = st, q: int = q) -> Term:
            r = st.req[i]
            pending = z.And(live(st, i), st.phase == _SCHED, st.prev[i] != NONE_INT)
            covered = []
            for j in range(q):
                older = s.queue[j]
                at = older.row_at[st.idx[i]]
                stale = z.Or(z.And(j < s.qlen, at >= 0, z.Not(live(older, at))),
                             z.And(has_row(c, s, j, r), older.partial[older.row_of[r]]))
                between = [counts_row(c, s, k, r) for k in range(j + 1, q)]
                after = z.Or(*between) if between else z.BoolVal(False)
                covered.append(z.Implies(stale, after))
            return z.Implies(pending, z.And(*covered))

        out.append(_rows(c, s, q, fine))
    return z.And(*out)


def partial_rows_first(c: Ctx, s: StateV) -> Term:
    """A request's partial-prefill rows in flight are in older steps than its token-yielding
    ones (its last chunk ends its prefill)."""
    z = c.smt.z
    out = []
    for q in range(c.opts.depth):
        for q2 in range(q + 1, c.opts.depth):
            later = s.queue[q2]

            def fine(r: Term, later: StepV = later, q2: int = q2, q: int = q) -> Term:
                partial_later = z.And(has_row(c, s, q2, r), later.partial[later.row_of[r]])
                return z.Implies(counts_row(c, s, q, r), z.Not(partial_later))

            out.append(_requests(c, fine))
    return z.And(*out)


def state_rows_hold_newest(c: Ctx, s: StateV) -> Term:
    """With state rows, for an active request: once a token-yielding row of it in flight has
    launched, its state row holds the newest token those launches yielded (with drafts, and its
    position); and while a row of it still to combine reads the device with no token-yielding
    row before it in flight, its state row holds its newest delivered token."""
    z, smt, rq, tb = c.smt.z, c.smt, s.requests, s.table

    def holds(r: Term) -> Term:
        sr = rq.state_row[r]
        nd = rq.ndelivered[r]
        launched = z.Or(*[z.And(counts_row(c, s, q, r), st.phase >= _LAUNCH)
                          for q, st in enumerate(s.queue)])
        at = nd + _launched_sum(c, s, r)
        written = [tb.newest[sr] == smt.tok(r, at)]
        delivered = [tb.newest[sr] == smt.tok(r, nd)]
        if c.opts.spec_tokens:
            written.append(tb.position[sr] == at)
            delivered.append(tb.position[sr] == nd)
        pending = []
        for q, st in enumerate(s.queue):
            i = st.row_of[r]
            before = z.Or(*[counts_row(c, s, j, r) for j in range(q)]) if q else False
            pending.append(z.And(has_row(c, s, q, r), st.phase == _SCHED,
                                 st.prev[i] != NONE_INT, z.Not(before)))
        return z.Implies(z.And(sr >= 0, _active(c, s, r)), z.And(
            z.Implies(launched, z.And(*written)),
            z.Implies(z.And(z.Not(launched), z.Or(*pending)), z.And(*delivered))))

    return _requests(c, holds)


class Conjunct(NamedTuple):
    name: str
    holds: Callable[[Ctx, StateV], Term]
    safety: bool
    """One of the model's invariants (else a strengthening conjunct)."""
    drafts: bool | None = None
    """Part of the invariant only with drafts (True), only without (False), or always."""
    state: str | None = None
    """Part of the invariant only with the ring ("ring"), only with state rows ("rows"), or
    always."""

    def applies(self, spec_tokens: int, state: str = "ring") -> bool:
        """Part of the invariant of an option set with ``spec_tokens`` drafts and ``state``."""
        return ((self.drafts is None or self.drafts == bool(spec_tokens))
                and (self.state is None or self.state == state))


SAFETY: tuple[Conjunct, ...] = (
    Conjunct("StaleHostIdsGuard", stale_host_ids_guard, True),
    Conjunct("NoReadOfReleasedOrOverwrittenSlot", no_read_of_released_or_overwritten_slot, True),
    Conjunct("NoRewriteWhileReaderOutstanding", no_rewrite_while_reader_outstanding, True),
    Conjunct("DepthBound", depth_bound, True),
    Conjunct("OutputIntegrity", output_integrity, True),
    Conjunct("FailedRequestsQuiet", failed_requests_quiet, True),
    Conjunct("NewestTokenInNewestStep", newest_token_in_newest_step, True, state="ring"),
    Conjunct("NoWriteToUnheldStateRow", no_write_to_unheld_state_row, True, state="rows"),
    Conjunct("StateRowsOwned", state_rows_owned, True, state="rows"),
    Conjunct("NewestTokenInStateRow", newest_token_in_state_row, True, state="rows"),
)

STRENGTHENING: tuple[Conjunct, ...] = (
    Conjunct("WellFormed", well_formed, False),
    Conjunct("ClosedAtOnlyWhenClosed", closed_at_only_when_closed, False),
    Conjunct("SlotsConsecutive", slots_consecutive, False),
    Conjunct("PhasesOrdered", phases_ordered, False),
    Conjunct("RowsNameRequests", rows_name_requests, False),
    Conjunct("LiveRowsActive", live_rows_active, False),
    Conjunct("WaitingOwesNothing", waiting_owes_nothing, False),
    Conjunct("PrefillBeforeTokens", prefill_before_tokens, False),
    Conjunct("WithinBudget", within_budget, False, drafts=False),
    Conjunct("PositionsConsecutive", positions_consecutive, False),
    Conjunct("HostRowsOweNothing", host_rows_owe_nothing, False),
    Conjunct("MirrorRowsFollow", mirror_rows_follow, False, state="ring"),
    Conjunct("RowsHoldTheirStateRow", rows_hold_their_state_row, False, state="rows"),
    Conjunct("DroppedRowsFirst", dropped_rows_first, False, state="rows"),
    Conjunct("DeviceRowsOverLiveRows", device_rows_over_live_rows, False, state="rows"),
    Conjunct("PartialRowsFirst", partial_rows_first, False, state="rows"),
    Conjunct("StateRowsHoldNewest", state_rows_hold_newest, False, state="rows"),
    Conjunct("LaunchedSlotHoldsTokens", launched_slot_holds_tokens, False),
    Conjunct("HostCopyHoldsTokens", host_copy_holds_tokens, False),
    Conjunct("PlaceholdersCountRows", placeholders_count_rows, False, drafts=True),
    Conjunct("HostRowsStaged", host_rows_staged, False, drafts=True),
)

CONJUNCTS = SAFETY + STRENGTHENING
"""The inductive invariant: all of them."""



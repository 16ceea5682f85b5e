"""The model's next-state relation for the solver, action by action, after `model/actions.py`.

Each action is a function of a state (of unbounded size, `symbolic.StateV`) that returns its
precondition and the state it leads to, as the model's action returns the next state or None.
The functions follow the model's line for line, in its vocabulary; `tests/proof` checks that the
two agree both ways on states the explorer reaches. A choice the model makes by enumeration
(which order of the eligible requests a step takes, which request an action names) is a free
constant here: `Ctx` makes them, and the successor relation holds for some value of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from typing import Any

from ..model.state import Bounds, Phase, Status
from .symbolic import NONE_INT, Params, RequestsV, SlotsV, Smt, StateV, StepV, TableV, Term

_W, _R, _P = int(Status.WAITING), int(Status.RUNNING), int(Status.PREEMPTED)
_CLOSED = (int(Status.FINISHED), int(Status.ABORTED), int(Status.FAILED))
_SCHED, _COMB, _LAUNCH, _RI, _RD = (int(p) for p in Phase)


@dataclass(frozen=True)
class Options:
    """What an option set fixes: the depth, the spec tokens, and the feature switches and
    known-bad variant of `model.state.Bounds`."""

    depth: int = 2
    spec_tokens: int = 0
    finish: bool = True
    abort: bool = True
    preempt: bool = True
    condense: bool = True
    guard: bool = True
    release_at: str = "complete"
    preempt_policy: str = "keep"
    faults: bool = False
    variant: str = ""
    slots_below_depth: bool = False
    """The known-bad ring of K = D - 1 slots; else any K >= D."""
    state: str = "ring"
    subsets: bool = False

    @staticmethod
    def of(b: Bounds) -> Options:
        """The option set a model bound belongs to."""
        return Options(depth=b.depth, spec_tokens=b.spec_tokens, finish=b.finish, abort=b.abort,
                       preempt=b.preempt, condense=b.condense, guard=b.guard,
                       release_at=b.release_at, preempt_policy=b.preempt_policy,
                       faults=b.faults, variant=b.variant, slots_below_depth=b.slots < b.depth,
                       state=b.state, subsets=b.subsets)

    @property
    def rows(self) -> bool:
        """Per-request state rows (spec rule 14), not the ring."""
        return self.state == "rows"


@dataclass
class Ctx:
    """One query's free choices (which request or slot an action names, a step's row order, a
    launch's verdict): fresh constants, and the constraints that tie them."""

    smt: Smt
    params: Params
    opts: Options
    side: list[Term] = field(default_factory=list)
    domain: int | None = None
    """None: quantifiers range over every integer (the proof). A number n: over 0..n-1 only,
    instantiated (a search for a small counterexample, or a pinned state of a model bound):
    every quantified body is guarded by its own range, so below n the two agree."""
    _ids: Iterator[int] = field(default_factory=count)
    _bound: list[Term] = field(default_factory=list)
    """The quantified variables around the term being built (for `lam` under cvc5)."""

    def binding(self, xs: list[Term], body: Callable[..., Term]) -> Term:
        """body(*xs) built with ``xs`` bound (a `lam` inside it depends on them)."""
        self._bound += xs
        try:
            return body(*xs)
        finally:
            del self._bound[-len(xs):]

    def forall(self, body: Callable[[Term], Term]) -> Term:
        """For every integer x (every x below `domain` when it is set): body(x)."""
        z = self.smt.z
        if self.domain is not None:
            return z.And(*[body(z.IntVal(x)) for x in range(self.domain)])
        x = z.Int(f"x{next(self._ids)}")
        return z.ForAll([x], self.binding([x], body))

    def forall2(self, body: Callable[[Term, Term], Term]) -> Term:
        """For every two integers x, y: body(x, y)."""
        z = self.smt.z
        if self.domain is not None:
            return z.And(*[body(z.IntVal(x), z.IntVal(y))
                           for x in range(self.domain) for y in range(self.domain)])
        x, y = z.Int(f"x{next(self._ids)}"), z.Int(f"y{next(self._ids)}")
        return z.ForAll([x, y], self.binding([x, y], body))

    def fresh(self, prefix: str, sort: Any) -> Term:
        return self.smt.z.Const(f"{prefix}!{next(self._ids)}", sort)

    def exists(self, body: Callable[[Term], Term]) -> Term:
        """A boolean that is true iff some integer x has ``body(x)``: a witness when true, a
        universal when false (so the relation stays exact in both directions)."""
        z = self.smt.z
        b, w = self.fresh("some", self.smt.Bool), self.fresh("w", self.smt.Int)
        self.side += [z.Implies(b, body(w)),
                      z.Implies(z.Not(b), self.forall(lambda x: z.Not(body(x))))]
        return b


# ---------------------------------------------------------------------------------------------
# Derived values (operators), as in the model.


def ring(c: Ctx, x: Term) -> Term:
    """x mod K for x in [-K, K) (a queue position's slot, the one before a slot), and with the
    known-bad ring of K = D - 1 slots for x in [-2K, 3K)."""
    z, k = c.smt.z, c.params.K
    if not c.opts.slots_below_depth:
        return z.If(x < 0, x + k, z.If(x >= k, x - k, x))
    return z.If(x < -k, x + 2 * k, z.If(x < 0, x + k, z.If(x < k, x, z.If(x < 2 * k, x - k,
                                                                          x - 2 * k))))


def in_range(c: Ctx, r: Term) -> Term:
    """``r`` names a request."""
    return c.smt.z.And(r >= 0, r < c.params.N)


def has_row(c: Ctx, s: StateV, q: int, r: Term) -> Term:
    """Queue place q holds an in-flight step with a live row of ``r``."""
    return c.smt.z.And(q < s.qlen, s.queue[q].row_of[r] >= 0)


def counts_row(c: Ctx, s: StateV, q: int, r: Term) -> Term:
    """Step q has a live row of ``r`` that will deliver a token (not a partial prefill)."""
    st = s.queue[q]
    return c.smt.z.And(has_row(c, s, q, r), c.smt.z.Not(st.partial[st.row_of[r]]))


def in_flight(c: Ctx, s: StateV, r: Term, before: int | None = None) -> Term:
    """How many in-flight rows of ``r`` will still deliver a token (of the steps before
    ``before``, if given)."""
    z = c.smt.z
    places = range(c.opts.depth if before is None else before)
    return z.Sum(*[z.If(counts_row(c, s, q, r), 1, 0) for q in places]) if places else 0


def has_step_in_flight(c: Ctx, s: StateV, r: Term) -> Term:
    """Some in-flight step holds a live row of ``r``, partial-prefill rows included."""
    return c.smt.z.Or(*[has_row(c, s, q, r) for q in range(c.opts.depth)])


def next_pos(c: Ctx, s: StateV, r: Term) -> Term:
    """Position of ``r``'s newest token: delivered ones plus those still in flight."""
    return s.requests.ndelivered[r] + in_flight(c, s, r)


def host_token(c: Ctx, s: StateV, r: Term, pos: Term) -> Term:
    """The host token table at ``pos``: authoritative if delivered, else a placeholder."""
    z, smt = c.smt.z, c.smt
    return z.If(pos == 0, smt.tok(r, 0),
                z.If(pos <= s.requests.ndelivered[r], s.requests.delivered[r][pos - 1],
                     smt.PLACEHOLDER))


def eligible(c: Ctx, s: StateV, r: Term) -> Term:
    """``r`` must be in the next step: active with budget left, and not a host-sync request
    with a step in flight (unless the known-bad variant)."""
    z = c.smt.z
    st = s.requests.status[r]
    unguarded = c.opts.variant == "host-sync-unguarded"
    held = z.And(c.params.HS[r], has_step_in_flight(c, s, r)) if not unguarded else False
    return z.And(in_range(c, r), z.Or(st == _W, st == _R), next_pos(c, s, r) < c.params.M[r],
                 z.Not(held))


def mirror_row(c: Ctx, st: StepV, r: Term) -> Term:
    """The row of ``st`` whose sampled id is ``r``'s newest token for the next combine, -1 if
    none: live and not a partial prefill's discarded id."""
    z = c.smt.z
    i = st.row_of[r]
    feeds = c.opts.variant == "partial-prefill-feeds-mirror"
    return z.If(z.And(i >= 0, z.Or(feeds, z.Not(st.partial[i]))), i, -1)


def newest_on_device(c: Ctx, s: StateV, r: Term) -> Term:
    """``r``'s newest token is in flight: some in-flight step has a token-yielding live row of
    it (a partial prefill's too, in the known-bad variant)."""
    return c.smt.z.Or(*[c.smt.z.And(q < s.qlen, mirror_row(c, s.queue[q], r) >= 0)
                        for q in range(c.opts.depth)])


def row_in_flight(c: Ctx, s: StateV, k: Term) -> Term:
    """With state rows: some in-flight step has a row, live or dropped, naming state row ``k``
    (its launch still scatters there)."""
    return c.smt.z.Or(*[c.smt.z.And(q < s.qlen, st.row_at[k] >= 0)
                        for q, st in enumerate(s.queue)])


def launched_into(c: Ctx, s: StateV, q: int, k: Term) -> Term:
    """Step q is in flight, wrote slot ``k`` at its launch."""
    st = s.queue[q]
    return c.smt.z.And(q < s.qlen, st.slot == k, st.phase >= _LAUNCH)


def is_writer(c: Ctx, s: StateV, k: Term, q: int) -> Term:
    """Step q is the in-flight step whose launch wrote ``k`` last."""
    z = c.smt.z
    later = [z.Not(launched_into(c, s, j, k)) for j in range(q + 1, c.opts.depth)]
    return z.And(launched_into(c, s, q, k), *later)


def no_writer(c: Ctx, s: StateV, k: Term) -> Term:
    """No in-flight step wrote ``k``: its writer retired."""
    return c.smt.z.And(*[c.smt.z.Not(launched_into(c, s, q, k)) for q in range(c.opts.depth)])


def readers_outstanding(c: Ctx, s: StateV, k: Term, q: int) -> Term:
    """Someone still has to read ``k`` before step q overwrites it: its writer's readback, or a
    combine other than the one right after q."""
    z = c.smt.z
    terms = []
    for j, st in enumerate(s.queue):
        mine = z.And(st.slot == k, st.phase >= _LAUNCH, st.phase < _RD)
        reads = z.And(st.src == k, st.phase == _SCHED) if j != q + 1 else False
        terms.append(z.And(j < s.qlen, z.Or(mine, reads)))
    return z.Or(*terms)


def read_slot(c: Ctx, s: StateV, k: Term, i: Term) -> Term:
    """What the device reads from slot ``k`` at row ``i``: garbage if unwritten or handed
    back."""
    sl = s.slots
    return c.smt.z.If(c.smt.z.Or(sl.unwritten[k], sl.released[k], i >= sl.length[k]),
                      c.smt.GARBAGE, sl.content[k][i])


def drafts_after(c: Ctx, token: Term, j: Term) -> Term:
    """The drafter's proposal at draft place j (0-based) after ``token``: the position j + 1
    past it; garbage in, garbage out."""
    smt = c.smt
    return smt.z.If(smt.who(token) < 0, token, smt.tok(smt.who(token), smt.at(token) + j + 1))


def drafts_scheduled(c: Ctx, s: StateV, r: Term) -> Term:
    """How many drafts the host schedules after ``r``'s newest token (the model's
    `drafts_scheduled`): K if the drafter proposed them, none for a prefill chunk or a new,
    resumed or re-entering request (the known-bad variant: K for a re-entering one past its
    prompt)."""
    z, rq, k = c.smt.z, s.requests, c.opts.spec_tokens
    reenters = rq.ndelivered[r] > 0
    bad = c.opts.variant == "reentering-drafts-from-device"
    other = z.If(reenters, k, 0) if bad else z.IntVal(0)
    return z.If(rq.prefill_left[r] > 0, 0,
                z.If(z.And(rq.drafts_ready[r], rq.status[r] != _W), k, other))


def yielded(c: Ctx, s: StateV, q: int, r: Term) -> Term:
    """With drafts: the tokens step q's launch yielded for ``r`` (a + 1 for its live
    token-yielding row; nothing before the launch)."""
    z, st = c.smt.z, s.queue[q]
    i = st.row_of[r]
    return z.If(z.And(q < s.qlen, st.has_accepted, i >= 0, z.Not(st.partial[i])),
                st.accepted[i] + 1, 0)


def true_pos(c: Ctx, s: StateV, q: int, r: Term) -> Term:
    """With drafts: ``r``'s newest token's position as step q's combine must see it."""
    return s.requests.ndelivered[r] + c.smt.z.Sum(0, *[yielded(c, s, j, r) for j in range(q)])


def inputs_right(c: Ctx, st: StepV, i: Term) -> Term:
    """With drafts: row i consumed its request's newest token, at its position, and the
    drafter's proposals after it."""
    z, smt = c.smt.z, c.smt
    newest = smt.tok(st.req[i], st.pos[i])
    drafts = [z.Implies(j < st.spec[i], st.drafts[i][j] == drafts_after(c, newest, z.IntVal(j)))
              for j in range(c.opts.spec_tokens)]
    return z.And(st.consumed[i] == newest, st.placed[i] == st.pos[i],
                 st.ndrafts[i] == st.spec[i], *drafts)


def live(st: StepV, i: Term) -> Term:
    """Row i is live (not dropped)."""
    return st.req[i] >= 0


# ---------------------------------------------------------------------------------------------
# Updates shared by several actions.


def set_step(s: StateV, q: int, st: StepV) -> StateV:
    return s.with_(queue=(*s.queue[:q], st, *s.queue[q + 1:]))


def store(c: Ctx, arr: Term, key: Term, value: Term) -> Term:
    return c.smt.z.Store(arr, key, value)


def lam(c: Ctx, sort: Any, body: Callable[[Term], Term]) -> Term:
    """The array x -> body(x).

    z3 has it as a term (a lambda is an array there). In cvc5 a lambda is a function, not an
    array, so the array is a fresh constant defined by a side constraint: for every x (and every
    value of the variables quantified around it, on which it then depends), A[x] == body(x)."""
    z = c.smt.z
    x = z.Const(f"x{next(c._ids)}", sort)
    if c.smt.name == "z3":
        return z.Lambda([x], body(x))
    outer = list(c._bound)
    value = c.binding([x], body)
    arr = z.ArraySort(sort, value.sort())
    for v in reversed(outer):
        arr = z.ArraySort(v.sort(), arr)
    a = c.fresh("lam", arr)
    for v in outer:
        a = a[v]
    c.side.append(z.ForAll([*outer, x], a[x] == value))
    return a


def drop(c: Ctx, s: StateV, gone: Callable[[Term], Term]) -> StateV:
    """Drop every in-flight row of the requests ``gone`` names and forget their tokens in
    slots and host copies (`model.actions._drop`); their placeholders and drafts go too."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int

    def mine(t: Term) -> Term:
        return z.And(smt.who(t) >= 0, gone(smt.who(t)))

    def scrub(arr: Term) -> Term:
        return lam(c, INT, lambda i: z.If(mine(arr[i]), smt.GARBAGE, arr[i]))

    def dropped(st: StepV) -> StepV:
        def dead(i: Term) -> Term:
            return z.And(st.req[i] >= 0, gone(st.req[i]))

        def blank(arr: Term, value: Any) -> Term:
            return lam(c, INT, lambda i: z.If(dead(i), value, arr[i]))

        return StepV(
            slot=st.slot, src=st.src, phase=st.phase, nrows=st.nrows,
            req=blank(st.req, -1),
            row_of=lam(c, INT, lambda r: z.If(gone(r), -1, st.row_of[r])),
            pos=blank(st.pos, 0), prev=blank(st.prev, NONE_INT),
            consumed=blank(st.consumed, smt.NONE),
            partial=lam(c, INT, lambda i: z.And(z.Not(dead(i)), st.partial[i])),
            spec=blank(st.spec, 0), placed=blank(st.placed, NONE_INT), drafts=st.drafts,
            ndrafts=blank(st.ndrafts, 0),
            host_copy=scrub(st.host_copy), has_host_copy=st.has_host_copy,
            accepted=st.accepted, has_accepted=st.has_accepted,
            host_counts=st.host_counts, has_host_counts=st.has_host_counts,
            idx=st.idx, was=st.was, row_at=st.row_at,  # the device still scatters there
        )

    queue = [dropped(st) for st in s.queue]
    sl = s.slots
    slots = SlotsV(
        unwritten=sl.unwritten, length=sl.length, released=sl.released, ncounts=sl.ncounts,
        content=lam(c, INT, lambda k: scrub(sl.content[k])),
        counts=lam(c, INT, lambda k: lam(c, INT, lambda i: z.If(
            z.And(i < sl.ncounts[k], mine(sl.content[k][i])), 0, sl.counts[k][i]))),
        positions=lam(c, INT, lambda k: lam(c, INT, lambda i: z.If(
            z.And(i < sl.ncounts[k], mine(sl.content[k][i])), -1, sl.positions[k][i]))),
    )
    rq = s.requests
    requests = RequestsV(
        status=rq.status, ndelivered=rq.ndelivered, delivered=rq.delivered,
        closed_at=rq.closed_at, unchecked=rq.unchecked, preemptions=rq.preemptions,
        prefill_left=rq.prefill_left,
        placeholders=lam(c, INT, lambda r: z.If(gone(r), 0, rq.placeholders[r])),
        drafts_ready=lam(c, INT, lambda r: z.And(z.Not(gone(r)), rq.drafts_ready[r])),
        state_row=rq.state_row,
    )
    tb = s.table
    if c.opts.rows:  # its state row is read again only after a host row of it rewrote it
        def theirs(k: Term) -> Term:
            return z.And(tb.owner[k] >= 0, gone(tb.owner[k]))

        tb = TableV(owner=tb.owner,
                    newest=lam(c, INT, lambda k: z.If(theirs(k), smt.GARBAGE, tb.newest[k])),
                    position=lam(c, INT, lambda k: z.If(theirs(k), -1, tb.position[k])))
    return s.with_(queue=tuple(queue), slots=slots, requests=requests, table=tb)


def set_request(c: Ctx, s: StateV, r: Term, **values: Term) -> StateV:
    """``s`` with request ``r``'s named fields set."""
    rq = s.requests
    changed = {name: store(c, getattr(rq, name), r, v) for name, v in values.items()}
    return s.with_(requests=RequestsV(**{**rq.__dict__, **changed}))


def shift_out(c: Ctx, s: StateV, q: int) -> StateV:
    """``s`` with queue place q removed: the steps after it move up one place."""
    return s.with_(queue=(*s.queue[:q], *s.queue[q + 1:], s.queue[q]), qlen=s.qlen - 1)


# ---------------------------------------------------------------------------------------------
# Actions: each returns (precondition, next state).

type Result = tuple[Term, StateV]


def allocate(c: Ctx, s: StateV) -> Result:
    """Load: allocate the ring of K mirror slots, before any step."""
    return c.smt.z.Not(s.allocated), s.with_(allocated=c.smt.z.BoolVal(True))


def arrive(c: Ctx, s: StateV) -> Result:
    """A request arrives; its first step prefills from host ids. With state rows it is given the
    lowest free state row (none free: it waits)."""
    z, smt = c.smt.z, c.smt
    r = c.fresh("r", c.smt.Int)
    pre = z.And(s.allocated, in_range(c, r), s.requests.status[r] == int(Status.ABSENT))
    if not c.opts.rows:
        return pre, set_request(c, s, r, status=z.IntVal(_W))
    k, tb = c.fresh("k", c.smt.Int), s.table
    lowest = c.forall(lambda j: z.Implies(z.And(j >= 0, j < k), tb.owner[j] >= 0))
    pre = z.And(pre, k >= 0, k < c.params.S, tb.owner[k] < 0, lowest)
    t = set_request(c, s, r, status=z.IntVal(_W), state_row=k)
    return pre, t.with_(table=TableV(owner=store(c, tb.owner, k, r),
                                     newest=store(c, tb.newest, k, smt.GARBAGE),
                                     position=store(c, tb.position, k, z.IntVal(-1))))


def schedule(c: Ctx, s: StateV) -> Result:
    """Schedule a step over every eligible request (with subsets: over the eligible requests a
    free choice picks) in some order, building the previous-row map: the order is a free
    bijection between rows 0..n-1 and the scheduled requests. With subsets and drafts each row
    carries a free number of drafts, up to those it has."""
    z = c.smt.z
    n, order, row_of, el = _scheduled_order(c, s)
    spec_of = _drafts_of_rows(c, s, n, order)
    cases = [(qlen, set_step(s, qlen, _scheduled_step(c, s, qlen, n, order, row_of, spec_of)))
             for qlen in range(c.opts.depth)]
    pre = z.And(s.allocated, s.qlen < c.opts.depth, c.exists(el))
    nxt = s.next_slot + 1
    t = pick(c, s.qlen, cases)
    return pre, t.with_(qlen=s.qlen + 1, requests=_scheduled_requests(c, s, el, row_of, spec_of),
                        next_slot=z.If(nxt >= c.params.K, 0, nxt))


def _scheduled_order(c: Ctx, s: StateV) -> tuple[Term, Term, Term, Callable[[Term], Term]]:
    """The step's rows: their number n, the free order (row -> request) and its inverse, and
    which requests are scheduled (every eligible one; with subsets, those a free choice picks)."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    n = c.fresh("nrows", INT)
    order = c.fresh("order", smt.IntArr)  # row -> request
    row_of = c.fresh("row_of", smt.IntArr)  # request -> row
    if c.opts.subsets:
        picked = c.fresh("picked", smt.BoolArr)  # the scheduler's choice among the eligible
        el = lambda r: z.And(eligible(c, s, r), picked[r])  # noqa: E731
    else:
        el = lambda r: eligible(c, s, r)  # noqa: E731
    c.side += [
        n >= 1,
        c.forall(lambda x: z.Implies(z.And(x >= 0, x < n),
                                     z.And(el(order[x]), row_of[order[x]] == x))),
        c.forall(lambda x: z.If(el(x),
                                z.And(row_of[x] >= 0, row_of[x] < n, order[row_of[x]] == x),
                                z.Implies(in_range(c, x), row_of[x] == -1))),
    ]
    if c.domain is not None:
        c.side.append(n <= c.domain)
    if not c.opts.condense:  # rows in request order
        c.side.append(c.forall2(lambda x, y: z.Implies(z.And(x >= 0, x < y, y < n),
                                                        order[x] < order[y])))
    return n, order, row_of, el


def _drafts_of_rows(c: Ctx, s: StateV, n: Term, order: Term) -> Callable[[Term], Term]:
    """Row i -> the drafts it carries: with subsets a free number up to those its request has,
    else all of them."""
    z, smt = c.smt.z, c.smt
    if c.opts.subsets and c.opts.spec_tokens:
        chosen = c.fresh("drafts", smt.IntArr)  # row -> drafts it carries
        c.side.append(c.forall(lambda x: z.Implies(z.And(x >= 0, x < n), z.And(
            chosen[x] >= 0, chosen[x] <= drafts_scheduled(c, s, order[x])))))
        return lambda i: chosen[i]
    return lambda i: drafts_scheduled(c, s, order[i])


def _scheduled_step(c: Ctx, s: StateV, qlen: int, n: Term, order: Term, row_of: Term,
                    spec_of: Callable[[Term], Term]) -> StepV:
    """The step scheduled behind `qlen` steps in flight."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    prev = s.queue[qlen - 1] if qlen else None

    def idx_of(i: Term) -> Term:
        """Row i's idx_mapping entry (the known-bad variant: the previous step's)."""
        own = s.requests.state_row[order[i]]
        if prev is None or c.opts.variant != "idx-from-previous-order":
            return own
        return z.If(i < prev.nrows, prev.idx[i], own)

    def prev_row(i: Term) -> Term:
        r = order[i]
        if prev is None or not c.opts.guard:
            return z.IntVal(NONE_INT)
        from_host = z.Or(s.requests.status[r] == _W, c.params.HS[r])
        if c.opts.rows:  # its state row, if its newest token is in flight anywhere
            if c.opts.variant == "skipped-from-previous-step":
                on_device = mirror_row(c, prev, r) >= 0
            else:
                on_device = z.Or(*[mirror_row(c, s.queue[j], r) >= 0 for j in range(qlen)])
            return z.If(z.Or(from_host, z.Not(on_device)), NONE_INT, idx_of(i))
        m = mirror_row(c, prev, r)
        return z.If(z.Or(from_host, m < 0), NONE_INT, m)

    uses = c.exists(lambda i: z.And(i >= 0, i < n, prev_row(i) >= 0)) \
        if prev is not None and c.opts.guard and not c.opts.rows else False
    spec_fields = _scheduled_drafts(c, s, order, prev_row, spec_of) if c.opts.spec_tokens \
        else {
        "pos": lam(c, INT, lambda i: next_pos(c, s, order[i])),
        "spec": z.K(INT, z.IntVal(0)), "placed": z.K(INT, z.IntVal(NONE_INT)),
        "drafts": s.queue[qlen].drafts, "ndrafts": z.K(INT, z.IntVal(0))}
    if c.opts.rows:
        idx = lam(c, INT, idx_of)
        rows_fields = {"idx": idx, "was": order, "row_at": _last_row_at(c, idx, n)}
    else:
        rows_fields = {"idx": z.K(INT, z.IntVal(NONE_INT)), "was": order,
                       "row_at": z.K(INT, z.IntVal(-1))}
    return StepV(
        slot=s.next_slot,
        src=z.If(uses, prev.slot, NONE_INT) if prev is not None else z.IntVal(NONE_INT),
        phase=z.IntVal(_SCHED), nrows=n, req=order, row_of=row_of,
        prev=lam(c, INT, prev_row), **rows_fields,
        consumed=z.K(INT, smt.NONE),
        partial=lam(c, INT, lambda i: s.requests.prefill_left[order[i]] > 0),
        **spec_fields,
        host_copy=s.queue[qlen].host_copy, has_host_copy=z.BoolVal(False),
        accepted=s.queue[qlen].accepted, has_accepted=z.BoolVal(False),
        host_counts=s.queue[qlen].host_counts, has_host_counts=z.BoolVal(False),
    )


def _scheduled_requests(c: Ctx, s: StateV, el: Callable[[Term], Term], row_of: Term,
                        spec_of: Callable[[Term], Term]) -> RequestsV:
    """The requests once the step is scheduled: running, a prefill chunk further, and with
    drafts their placeholders and drafts counted."""
    z, INT = c.smt.z, c.smt.Int
    rq = s.requests
    requests = RequestsV(
        status=lam(c, INT, lambda r: z.If(el(r), _R, rq.status[r])),
        ndelivered=rq.ndelivered, delivered=rq.delivered, closed_at=rq.closed_at,
        unchecked=lam(c, INT, lambda r: z.And(z.Not(el(r)), rq.unchecked[r])),
        preemptions=rq.preemptions,
        prefill_left=lam(c, INT, lambda r: z.If(z.And(el(r), rq.prefill_left[r] > 0),
                                              rq.prefill_left[r] - 1, rq.prefill_left[r])),
        placeholders=rq.placeholders, drafts_ready=rq.drafts_ready, state_row=rq.state_row,
    )
    if not c.opts.spec_tokens:
        return requests
    # Placeholders: 1 + spec per row that will yield; drafts follow this step's rows (a
    # request left out by subsets keeps its own).
    yields = lambda r: z.And(el(r), rq.prefill_left[r] <= 0)  # noqa: E731
    keeps = c.opts.subsets or c.opts.rows
    ready = (lambda r: z.If(el(r), yields(r), rq.drafts_ready[r])) if keeps else yields
    return RequestsV(**{
        **requests.__dict__,
        "placeholders": lam(c, INT, lambda r: rq.placeholders[r] + z.If(
            yields(r), 1 + spec_of(row_of[r]), 0)),
        "drafts_ready": lam(c, INT, ready)})



def _last_row_at(c: Ctx, idx: Term, n: Term) -> Term:
    """A fresh array: state row -> the last of the rows 0..n-1 whose ``idx`` names it, -1 if
    none (the inverse the post-update scatters through)."""
    z = c.smt.z
    row_at = c.fresh("row_at", c.smt.IntArr)

    def entry(k: Term) -> Term:
        at = row_at[k]
        named = z.And(at < n, idx[at] == k, c.forall(
            lambda j: z.Implies(z.And(j > at, j < n), idx[j] != k)))
        unnamed = c.forall(lambda j: z.Implies(z.And(j >= 0, j < n), idx[j] != k))
        return z.If(at >= 0, named, z.And(at == -1, unnamed))

    c.side.append(c.forall(entry))
    return row_at


def _scheduled_drafts(c: Ctx, s: StateV, order: Term, prev_of: Callable[[Term], Term],
                      spec_of: Callable[[Term], Term]) -> dict[str, Term]:
    """With drafts, a new step's rows: position -1 (fixed at the combine), the drafts scheduled
    (row i: ``spec_of(i)``), and for a host row the host's position and the drafts read back
    after its newest token (placeholders where the host has none); a mirror row's come from the
    device."""
    z, smt, INT, rq = c.smt.z, c.smt, c.smt.Int, s.requests

    def host(i: Term) -> Term:
        return prev_of(i) == NONE_INT

    def placed(r: Term) -> Term:
        return rq.ndelivered[r] + rq.placeholders[r]

    def draft(i: Term, j: Term) -> Term:
        r = order[i]
        return z.If(rq.drafts_ready[r], drafts_after(c, host_token(c, s, r, placed(r)), j),
                    smt.PLACEHOLDER)

    return {
        "pos": z.K(INT, z.IntVal(-1)),
        "spec": lam(c, INT, spec_of),
        "placed": lam(c, INT, lambda i: z.If(host(i), placed(order[i]), NONE_INT)),
        "drafts": lam(c, INT, lambda i: lam(c, INT, lambda j: draft(i, j))),
        "ndrafts": lam(c, INT, lambda i: z.If(host(i), spec_of(i), 0)),
    }


def pick(c: Ctx, key: Term, cases: list[tuple[int, StateV]]) -> StateV:
    """The state of the case whose number ``key`` is (the last case otherwise)."""
    out = cases[-1][1]
    for value, st in reversed(cases[:-1]):
        out = ite_state(c, key == value, st, out)
    return out


def ite_state(c: Ctx, cond: Term, a: StateV, b: StateV) -> StateV:
    """``a`` where ``cond`` holds, else ``b``, field by field."""
    z = c.smt.z

    def ite(x: Term, y: Term) -> Term:
        return x if x is y else z.If(cond, x, y)

    queue = tuple(StepV(**{f: ite(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__})
                  for x, y in zip(a.queue, b.queue, strict=True))
    return StateV(
        allocated=ite(a.allocated, b.allocated), next_slot=ite(a.next_slot, b.next_slot),
        qlen=ite(a.qlen, b.qlen), queue=queue,
        slots=SlotsV(**{f: ite(getattr(a.slots, f), getattr(b.slots, f))
                        for f in a.slots.__dataclass_fields__}),
        requests=RequestsV(**{f: ite(getattr(a.requests, f), getattr(b.requests, f))
                              for f in a.requests.__dataclass_fields__}),
        broken_read=ite(a.broken_read, b.broken_read),
        broken_rewrite=ite(a.broken_rewrite, b.broken_rewrite),
        table=TableV(**{f: ite(getattr(a.table, f), getattr(b.table, f))
                        for f in a.table.__dataclass_fields__}),
        broken_unheld=ite(a.broken_unheld, b.broken_unheld),
    )


def combine(c: Ctx, s: StateV, q: int) -> Result:
    """Build step q's input ids on device: host ids, or the previous slot through the row
    map."""
    z, INT = c.smt.z, c.smt.Int
    st = s.queue[q]
    pre = z.And(q < s.qlen, st.phase == _SCHED,
                z.Or(q == 0, s.queue[q - 1].phase >= _LAUNCH) if q else True)
    if c.opts.rows:  # the combine reads state rows, no slot
        broken = s.broken_read
    else:
        reads = c.exists(lambda i: z.And(i >= 0, i < st.nrows, live(st, i),
                                         st.prev[i] != NONE_INT))
        broken = z.Or(s.broken_read, z.And(reads, s.slots.released[st.src]))
    if c.opts.spec_tokens:
        st2 = _combine_with_drafts(c, s, q)
    else:
        def device(i: Term) -> Term:
            if c.opts.rows:
                return s.table.newest[st.idx[i]]
            return read_slot(c, s, st.src, st.prev[i])

        consumed = lam(c, INT, lambda i: z.If(
            z.Not(live(st, i)), st.consumed[i],
            z.If(st.prev[i] == NONE_INT, host_token(c, s, st.req[i], st.pos[i]), device(i))))
        st2 = StepV(**{**st.__dict__, "phase": z.IntVal(_COMB), "consumed": consumed})
    return pre, set_step(s, q, st2).with_(broken_read=broken)


def _combine_with_drafts(c: Ctx, s: StateV, q: int) -> StepV:
    """Step q combined with drafts: each live row's newest token, position and drafts from the
    host (a host row: as staged) or from the previous step's slot (a mirror row: all three on
    the device), and its true position."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    st, sl = s.queue[q], s.slots

    def host(i: Term) -> Term:
        return st.prev[i] == NONE_INT

    tb = s.table

    def newest(i: Term) -> Term:
        device = tb.newest[st.idx[i]] if c.opts.rows else read_slot(c, s, st.src, st.prev[i])
        return z.If(host(i), host_token(c, s, st.req[i], st.placed[i]), device)

    def placed(i: Term) -> Term:
        p = st.prev[i]
        if c.opts.rows:
            return z.If(host(i), st.placed[i],
                        z.If(newest(i) != smt.GARBAGE, tb.position[st.idx[i]], -1))
        readable = z.And(newest(i) != smt.GARBAGE, p < sl.ncounts[st.src])
        return z.If(host(i), st.placed[i], z.If(readable, sl.positions[st.src][p], -1))

    def count(i: Term) -> Term:  # the known-bad variant: the first row's for every row
        return st.spec[0] if c.opts.variant == "draft-count-of-another-row" else st.spec[i]

    def keep(arr: Term, value: Callable[[Term], Term]) -> Term:
        return lam(c, INT, lambda i: z.If(live(st, i), value(i), arr[i]))

    return StepV(**{
        **st.__dict__, "phase": z.IntVal(_COMB),
        "pos": keep(st.pos, lambda i: true_pos(c, s, q, st.req[i])),
        "consumed": keep(st.consumed, newest),
        "placed": keep(st.placed, placed),
        "drafts": keep(st.drafts, lambda i: z.If(host(i), st.drafts[i], lam(
            c, INT, lambda j: drafts_after(c, newest(i), j)))),
        "ndrafts": keep(st.ndrafts, lambda i: z.If(host(i), st.spec[i], count(i))),
    })


def launch(c: Ctx, s: StateV, q: int) -> Result:
    """Run step q's forward and sampler; the sampler writes its tokens into the step's slot:
    the next token of a row that consumed its newest, garbage otherwise."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    st = s.queue[q]
    pre = z.And(q < s.qlen, st.phase == _COMB)
    broken = z.Or(s.broken_rewrite, readers_outstanding(c, s, st.slot, q))
    if c.opts.spec_tokens:
        t = _launch_with_drafts(c, s, q).with_(broken_rewrite=broken)
        return pre, _post_update(c, s, t, q) if c.opts.rows else t
    content = lam(c, INT, lambda i: z.If(
        z.And(live(st, i), z.Not(st.partial[i]), st.consumed[i] == smt.tok(st.req[i], st.pos[i])),
        smt.tok(st.req[i], st.pos[i] + 1), smt.GARBAGE))
    sl = s.slots
    slots = SlotsV(**{**sl.__dict__,
                      "unwritten": store(c, sl.unwritten, st.slot, z.BoolVal(False)),
                      "length": store(c, sl.length, st.slot, st.nrows),
                      "content": store(c, sl.content, st.slot, content),
                      "released": store(c, sl.released, st.slot, z.BoolVal(False))})
    st2 = StepV(**{**st.__dict__, "phase": z.IntVal(_LAUNCH)})
    t = set_step(s, q, st2).with_(slots=slots, broken_rewrite=broken)
    return pre, _post_update(c, s, t, q) if c.opts.rows else t


def _post_update(c: Ctx, s: StateV, t: StateV, q: int) -> StateV:
    """With state rows: step q's launch scatters each row's newest token (what it just wrote
    into its slot, garbage for a dropped row; with drafts the advanced position) into the state
    row its idx names, the last row naming one winning; scattering into a row whose owner is
    not the row's request breaks the state rows' ownership rule (`model.actions._post_update`)."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    st, tb = s.queue[q], s.table
    sl = t.slots

    def written(k: Term) -> Term:
        return st.row_at[k] >= 0

    def newest(k: Term) -> Term:
        i = st.row_at[k]
        return z.If(live(st, i), sl.content[st.slot][i], smt.GARBAGE)

    def position(k: Term) -> Term:
        if not c.opts.spec_tokens:
            return z.IntVal(-1)
        i = st.row_at[k]
        return z.If(live(st, i), sl.positions[st.slot][i], -1)

    unheld = c.exists(lambda i: z.And(i >= 0, i < st.nrows, tb.owner[st.idx[i]] != st.was[i]))
    table = TableV(
        owner=tb.owner,
        newest=lam(c, INT, lambda k: z.If(written(k), newest(k), tb.newest[k])),
        position=lam(c, INT, lambda k: z.If(written(k), position(k), tb.position[k])))
    return t.with_(table=table, broken_unheld=z.Or(s.broken_unheld, unheld))


def _launch_with_drafts(c: Ctx, s: StateV, q: int) -> StateV:
    """Step q launched with drafts: the verdict (each row's accepted count, up to its drafts
    where its inputs are right, else 0) is a free choice; the slot gets per row the newest token
    after the accepted drafts, the count a + 1 and the advanced position (`_verify`)."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    st, sl = s.queue[q], s.slots
    acc = c.fresh("accepted", smt.IntArr)

    def yields(i: Term) -> Term:
        return z.And(live(st, i), z.Not(st.partial[i]))

    def top(i: Term) -> Term:
        return z.If(z.And(yields(i), inputs_right(c, st, i)), st.spec[i], 0)

    c.side.append(c.forall(lambda i: z.Implies(z.And(i >= 0, i < st.nrows),
                                               z.And(acc[i] >= 0, acc[i] <= top(i)))))
    if c.domain is not None:
        c.side.append(st.nrows <= c.domain)

    def token(i: Term) -> Term:
        good = smt.tok(st.req[i], st.pos[i] + acc[i] + 1)
        if c.opts.variant == "rejected-draft-newest":
            good = z.If(acc[i] < st.spec[i], smt.REJECTED, good)
        return z.If(yields(i), z.If(inputs_right(c, st, i), good, smt.GARBAGE), smt.GARBAGE)

    advance = (lambda i: 1 + st.spec[i]) if c.opts.variant == "positions-advance-by-spec" \
        else (lambda i: acc[i] + 1)
    k = st.slot
    slots = SlotsV(
        unwritten=store(c, sl.unwritten, k, z.BoolVal(False)),
        length=store(c, sl.length, k, st.nrows),
        content=store(c, sl.content, k, lam(c, INT, token)),
        released=store(c, sl.released, k, z.BoolVal(False)),
        ncounts=store(c, sl.ncounts, k, st.nrows),
        counts=store(c, sl.counts, k, lam(c, INT, lambda i: z.If(yields(i), acc[i] + 1, 0))),
        positions=store(c, sl.positions, k, lam(c, INT, lambda i: z.If(
            yields(i), st.placed[i] + advance(i), -1))),
    )
    st2 = StepV(**{**st.__dict__, "phase": z.IntVal(_LAUNCH), "accepted": acc,
                   "has_accepted": z.BoolVal(True)})
    return set_step(s, q, st2).with_(slots=slots)


def readback_issue(c: Ctx, s: StateV, q: int) -> Result:
    """Enqueue the non-blocking copy of step q's slot to a host tensor, and its event."""
    z = c.smt.z
    st = s.queue[q]
    pre = z.And(q < s.qlen, st.phase == _LAUNCH)
    return pre, set_step(s, q, StepV(**{**st.__dict__, "phase": z.IntVal(_RI)}))


def readback_complete(c: Ctx, s: StateV, q: int) -> Result:
    """Step q's readback event completes: the host tensor now holds the slot's content."""
    z, INT = c.smt.z, c.smt.Int
    st = s.queue[q]
    pre = z.And(q < s.qlen, st.phase == _RI)
    broken = z.Or(s.broken_read, s.slots.released[st.slot], z.Not(is_writer(c, s, st.slot, q)))
    host_copy = lam(c, INT, lambda i: read_slot(c, s, st.slot, i))
    st2 = StepV(**{**st.__dict__, "phase": z.IntVal(_RD), "host_copy": host_copy,
                   "has_host_copy": z.BoolVal(True)})
    if c.opts.spec_tokens:  # the counts come back with the tokens; an unreadable one reads 1
        sl = s.slots
        counts = lam(c, INT, lambda i: z.If(
            z.Or(sl.unwritten[st.slot], sl.released[st.slot], i >= sl.ncounts[st.slot]), 1,
            sl.counts[st.slot][i]))
        st2 = StepV(**{**st2.__dict__, "host_counts": counts,
                       "has_host_counts": z.BoolVal(True)})
    return pre, set_step(s, q, st2).with_(broken_read=broken)


def apply(c: Ctx, s: StateV) -> Result:
    """Retire the oldest step: deliver each live row's tokens (with drafts: its accepted drafts
    then its newest, cut at max tokens, and its placeholders drained); max tokens finishes a
    request."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    st = s.queue[0]
    pre = z.And(s.qlen > 0, st.phase == _RD)
    rq, spec = s.requests, c.opts.spec_tokens

    def row(r: Term) -> Term:
        return st.row_of[r]

    def delivers(r: Term) -> Term:
        return z.And(in_range(c, r), row(r) >= 0, z.Not(st.partial[row(r)]))

    def count(r: Term) -> Term:
        return st.host_counts[row(r)] if spec else z.IntVal(1)

    def reached(r: Term) -> Term:  # delivered tokens after this apply, before the cut
        return rq.ndelivered[r] + count(r)

    def after(r: Term) -> Term:  # a run past max tokens is cut there (with drafts)
        if not spec:
            return reached(r)
        return z.If(reached(r) > c.params.M[r], c.params.M[r], reached(r))

    def done(r: Term) -> Term:
        return z.And(delivers(r), after(r) >= c.params.M[r])

    def token(r: Term, x: Term) -> Term:
        """Index x of the delivered tokens after this apply (`expand`)."""
        n, i = rq.ndelivered[r], row(r)
        last = z.If(x == n + count(r) - 1, st.host_copy[i], rq.delivered[r][x])
        if spec:
            last = z.If(x < n + count(r) - 1, smt.tok(r, st.pos[i] + 1 + x - n), last)
        return z.If(x < n, rq.delivered[r][x], last)

    fields = {
        "ndelivered": lam(c, INT, lambda r: z.If(delivers(r), after(r), rq.ndelivered[r])),
        "delivered": lam(c, INT, lambda r: z.If(
            delivers(r), lam(c, INT, lambda x: token(r, x)), rq.delivered[r])),
        "status": lam(c, INT, lambda r: z.If(done(r), int(Status.FINISHED), rq.status[r])),
        "closed_at": lam(c, INT, lambda r: z.If(done(r), after(r), rq.closed_at[r])),
        "unchecked": lam(c, INT, lambda r: z.If(done(r), False,
                                                z.Or(delivers(r), rq.unchecked[r]))),
    }
    if spec:
        # Drain what the row yielded, roll back what it rejected (vLLM 0.33); the known-bad
        # variant drains 1 for the yielded ones.
        def drained(r: Term) -> Term:
            by = 1 if c.opts.variant == "placeholders-drain-by-one" else count(r)
            return by + st.spec[row(r)] + 1 - count(r)

        def left(r: Term) -> Term:
            n = rq.placeholders[r] - drained(r)
            return z.If(delivers(r), z.If(n < 0, 0, n), rq.placeholders[r])

        fields["placeholders"] = lam(c, INT, left)
    requests = RequestsV(**{**rq.__dict__, **fields})
    t = shift_out(c, s, 0).with_(requests=requests)
    # With drafts a later step may still carry a finished request: those rows drop.
    t = drop(c, t, lambda r: z.And(done(r), has_step_in_flight(c, t, r)))
    return pre, t


def release(c: Ctx, s: StateV) -> Result:
    """Hand a slot back: its readback is done and no combine will read it again."""
    z, INT = c.smt.z, c.smt.Int
    k = c.fresh("k", INT)
    sl = s.slots
    pre = [s.allocated, k >= 0, k < c.params.K, z.Not(sl.unwritten[k]), z.Not(sl.released[k])]
    if c.opts.release_at == "complete":
        pending = z.Or(*[z.And(q < s.qlen, st.src == k, st.phase == _SCHED)
                         for q, st in enumerate(s.queue)])
        pre += [no_writer(c, s, k), z.Not(pending)]
    else:  # known-bad: once its writer's readback is only issued
        pre += [z.And(*[z.Implies(is_writer(c, s, k, q), s.queue[q].phase >= _RI)
                        for q in range(c.opts.depth)])]
    slots = SlotsV(**{**sl.__dict__,
                      "length": store(c, sl.length, k, z.IntVal(0)),
                      "released": store(c, sl.released, k, z.BoolVal(True)),
                      "ncounts": store(c, sl.ncounts, k, z.IntVal(0))})
    return z.And(*pre), s.with_(slots=slots)


def release_row(c: Ctx, s: StateV) -> Result:
    """With state rows: hand a state row back once its owner closed and no in-flight step will
    still scatter into it (the known-bad variant: at close)."""
    z, smt, INT = c.smt.z, c.smt, c.smt.Int
    k = c.fresh("k", INT)
    tb, rq = s.table, s.requests
    owner = tb.owner[k]
    status = rq.status[owner]
    pre = [k >= 0, k < c.params.S, owner >= 0, z.Or(*[status == x for x in _CLOSED])]
    if c.opts.variant != "state-row-reused-in-flight":
        pre.append(z.Not(row_in_flight(c, s, k)))
    t = set_request(c, s, owner, state_row=z.IntVal(-1))
    return z.And(*pre), t.with_(table=TableV(owner=store(c, tb.owner, k, z.IntVal(-1)),
                                             newest=store(c, tb.newest, k, smt.GARBAGE),
                                             position=store(c, tb.position, k, z.IntVal(-1))))


def _close(c: Ctx, s: StateV, r: Term, status: Status) -> StateV:
    """Drop ``r``'s rows and close it with what it was delivered."""
    z = c.smt.z
    s = drop(c, s, lambda x: x == r)
    return set_request(c, s, r, status=z.IntVal(int(status)),
                       closed_at=s.requests.ndelivered[r], unchecked=z.BoolVal(False))


def finish(c: Ctx, s: StateV) -> Result:
    """The newest delivered token was a stop token: the request finishes, in-flight rows
    drop."""
    z = c.smt.z
    r = c.fresh("r", c.smt.Int)
    st = s.requests.status[r]
    pre = z.And(c.opts.finish, in_range(c, r), *[st != x for x in _CLOSED],
                s.requests.unchecked[r])
    return pre, _close(c, s, r, Status.FINISHED)


def abort(c: Ctx, s: StateV) -> Result:
    """The user aborts the request: nothing more is delivered, in-flight rows drop."""
    z = c.smt.z
    r = c.fresh("r", c.smt.Int)
    st = s.requests.status[r]
    pre = z.And(c.opts.abort, in_range(c, r), z.Or(st == _W, st == _R, st == _P))
    return pre, _close(c, s, r, Status.ABORTED)


def preempt(c: Ctx, s: StateV) -> Result:
    """The KV budget is exceeded: the request is preempted; its in-flight tokens are kept
    (keep) or dropped (drop)."""
    z = c.smt.z
    r = c.fresh("r", c.smt.Int)
    rq = s.requests
    pre = z.And(c.opts.preempt, in_range(c, r), rq.status[r] == _R,
                rq.preemptions[r] < c.params.P)
    if c.opts.preempt_policy == "drop":
        s = drop(c, s, lambda x: x == r)
    t = set_request(c, s, r, status=z.IntVal(_P), unchecked=z.BoolVal(False),
                    preemptions=s.requests.preemptions[r] + 1, prefill_left=z.IntVal(0),
                    drafts_ready=z.BoolVal(False))
    return pre, t


def resume(c: Ctx, s: StateV) -> Result:
    """A preempted request waits again, once it owns no placeholder."""
    z = c.smt.z
    r = c.fresh("r", c.smt.Int)
    pre = [in_range(c, r), s.requests.status[r] == _P]
    if c.opts.variant != "resume-with-placeholder":
        owned = s.requests.placeholders[r] if c.opts.spec_tokens else in_flight(c, s, r)
        pre.append(owned == 0)
    return z.And(*pre), set_request(c, s, r, status=z.IntVal(_W))


def fault(c: Ctx, s: StateV, q: int) -> Result:
    """The device fails step q before its readback completed: its requests fail, their rows
    elsewhere drop, and the step leaves the queue."""
    z = c.smt.z
    st = s.queue[q]
    pre = z.And(c.opts.faults, q < s.qlen, st.phase != _RD)

    def failed(r: Term) -> Term:
        return z.And(in_range(c, r), st.row_of[r] >= 0)

    t = s
    if c.opts.variant != "fault-spares-later-rows":
        t = drop(c, t, failed)
    rq = t.requests
    INT = c.smt.Int
    t = t.with_(requests=RequestsV(**{
        **rq.__dict__,
        "status": lam(c, INT, lambda r: z.If(failed(r), int(Status.FAILED), rq.status[r])),
        "closed_at": lam(c, INT, lambda r: z.If(failed(r), rq.ndelivered[r], rq.closed_at[r])),
        "unchecked": lam(c, INT, lambda r: z.And(z.Not(failed(r)), rq.unchecked[r])),
    }))
    newest = q == s.qlen - 1
    return pre, shift_out(c, t, q).with_(next_slot=z.If(newest, st.slot, s.next_slot))


REQUEST_ACTIONS = {"arrive": arrive, "finish": finish, "abort": abort, "preempt": preempt,
                   "resume": resume, "release": release, "allocate": allocate,
                   "schedule": schedule, "apply": apply}
STEP_ACTIONS = {"combine": combine, "launch": launch, "readback_issue": readback_issue,
                "readback_complete": readback_complete, "fault": fault}


def actions(opts: Options) -> list[tuple[str, Callable[[Ctx, StateV], Result]]]:
    """Every action of the option set, one entry per queue place for the step actions: the
    names obligations are reported under (``combine@1`` is the combine of queue place 1)."""
    out: list[tuple[str, Callable[[Ctx, StateV], Result]]] = []
    for name, fn in REQUEST_ACTIONS.items():
        out.append((name, fn))
    if opts.rows:
        out.append(("release_row", release_row))
    for name, sfn in STEP_ACTIONS.items():
        if name == "fault" and not opts.faults:
            continue
        for q in range(opts.depth):
            out.append((f"{name}@{q}", partial(sfn, q=q)))
    return out


def step(c: Ctx, name: str, s: StateV) -> tuple[Term, StateV]:
    """Action ``name`` from ``s``: when it is enabled (for some value of its free choices), and
    the state it leads to, as terms over ``s`` and those choices."""
    fn = dict(actions(c.opts))[name]
    pre, post = fn(c, s)
    return c.smt.z.And(pre, *c.side), post

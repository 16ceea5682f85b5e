"""The proof obligations of an option set, discharged by the solver one query each.

1. Initiation: every initial state satisfies the inductive invariant.
2. Consecution, per action (and queue place): from any state satisfying the invariant, the action
   leads to a state satisfying it. A failure names the action and the conjuncts it breaks.
3. Safety: the invariant implies each of the model's safety invariants.

A query runs first over every integer (the proof); where it is not unsatisfiable, the same query
runs over a small domain (every quantifier instantiated below a few requests, rows, slots and
tokens), which either finds a concrete counterexample to induction or says none is that small.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ..model.state import Bounds, State, Status
from .concrete import Reader, decode, pin, pin_params
from .inductive import CONJUNCTS, SAFETY, Conjunct
from .relation import Ctx, Options, actions, in_range, step
from .symbolic import NONE_INT, Params, Smt, StateV, StepV, fresh_params, fresh_state

SEARCH_DOMAIN = 3
"""Quantifiers range below this in the search for a small counterexample: requests, rows,
slots, delivered tokens."""

RLIMIT = 500_000_000
"""The solver's resource units per query (z3's rlimit): a drop with drafts (finish, abort) takes
the most, under half of it."""

CVC5_RLIMIT = 200_000
"""cvc5's resource units per query (its rlimit-per; units not z3's): enough for every query it
proves at the default options, and beyond it the rest stay unknown however long it runs."""

SEARCH_REQUESTS = 2
"""A small counterexample has at most this many requests: the explorer can then look it up."""


@dataclass
class Cti:
    """A counterexample to induction: a state satisfying the invariant, an action, and the
    state it leads to, which breaks ``broken``."""

    action: str
    broken: list[str]
    before: State
    after: State
    bounds: Bounds
    """The model bound the two states belong to (requests, slots, max tokens per request, ...)."""


@dataclass
class Result:
    """One obligation's verdict."""

    kind: str
    """initiation, consecution or safety."""
    name: str
    """The action (consecution), the safety invariant (safety), or "init"."""
    verdict: str
    """holds, fails, or unknown (neither proved nor a small counterexample found)."""
    seconds: float
    cti: Cti | None = None
    detail: str = ""

    def line(self) -> str:
        where = f" ({', '.join(self.cti.broken)})" if self.cti else ""
        return f"{self.kind:<12} {self.name:<34} {self.verdict:<8} {self.seconds:6.2f} s{where}"


@dataclass
class Setup:
    """What one query is built from: the solver, the option set and which conjuncts."""

    smt: Smt
    opts: Options
    conjuncts: tuple[Conjunct, ...] = CONJUNCTS
    rlimit: int = RLIMIT
    domain: int | None = None
    accept: Callable[[Cti], bool] | None = None
    """Whether a counterexample will do (the explorer reaches it); None: the first."""
    tries: int = 1
    """Counterexamples to ask for before settling for the first (at least one)."""
    record: list[tuple[str, str]] | None = None
    """Where given, the proof asks every conjunct (not only up to the first that is not
    unsat), appends each one's name and verdict here, and no search follows: the cross-check
    by a second solver, conjunct by conjunct."""

    @property
    def invariant(self) -> tuple[Conjunct, ...]:
        """The conjuncts of this option set's invariant."""
        return tuple(cj for cj in self.conjuncts
                     if cj.applies(self.opts.spec_tokens, self.opts.state))

    def ctx(self, params: Params) -> Ctx:
        return Ctx(self.smt, params, self.opts, domain=self.domain)


def assumptions(c: Ctx, s: StateV | None = None) -> list[Any]:
    """What the option set fixes about the unbounded parameters: at least one request, a ring of
    K >= D slots (K = D - 1 for the known-bad ring), preemptions, chunks and max tokens of at
    least what the model allows; over a small domain, every count below it, at most
    SEARCH_REQUESTS requests and a ring of D slots (so the explorer can look it up)."""
    z, p, d = c.smt.z, c.params, c.opts.depth
    ring = d - 1 == p.K if c.opts.slots_below_depth else d <= p.K
    out = [p.N >= 1, ring, p.K >= 1, p.P >= 0, p.C >= 1, p.S >= 1,
           c.forall(lambda r: z.Implies(in_range(c, r), p.M[r] >= 1))]
    if c.domain is not None:
        out += [p.N <= SEARCH_REQUESTS, max(d, 1) >= p.K, p.P <= 1, p.C <= 2, p.S <= p.N,
                c.forall(lambda r: p.M[r] <= c.domain)]
        if s is not None:
            out += [st.nrows <= c.domain for st in s.queue]
            out += search_shape(c, s)
    return out


def search_shape(c: Ctx, s: StateV) -> list[Any]:
    """What a small counterexample's first state looks like besides the invariant, so that it is
    one a reader can follow and the explorer can look up: a step has no more rows than there
    are requests, a dropped row is blank, and statuses and phases are ones the model has. Facts
    of every reachable state, but no part of the proof (the proof holds without them)."""
    z, smt = c.smt.z, c.smt

    def blank(q: int, st: StepV) -> Any:
        return z.Implies(q < s.qlen, z.And(st.nrows <= c.params.N, c.forall(lambda i: z.Implies(
            z.And(i >= 0, i < st.nrows, st.req[i] < 0),
            z.And(st.pos[i] == 0, st.prev[i] == NONE_INT, st.consumed[i] == smt.NONE,
                  z.Not(st.partial[i]))))))

    return [*[blank(q, st) for q, st in enumerate(s.queue)], *decodable(c, s)]


def decodable(c: Ctx, s: StateV) -> list[Any]:
    """Statuses and phases a model state can hold (else the counterexample cannot be shown in
    the model's words)."""
    z = c.smt.z
    rq = s.requests
    phases = [z.Implies(q < s.qlen, z.And(st.phase >= 0, st.phase <= 4))
              for q, st in enumerate(s.queue)]
    return [s.qlen >= 0, s.qlen <= c.opts.depth, *phases, c.forall(lambda r: z.Implies(
        in_range(c, r), z.And(rq.status[r] >= 0, rq.status[r] <= int(Status.FAILED))))]


def initial(c: Ctx, s: StateV) -> Any:
    """The initial state (`model.state.initial_state`): no ring, nothing in flight, no request
    arrived, every slot unwritten."""
    z, INT = c.smt.z, c.smt.Int
    rq, sl = s.requests, s.slots
    tb = s.table
    return z.And(
        z.Not(s.allocated), s.next_slot == 0, s.qlen == 0,
        z.Not(s.broken_read), z.Not(s.broken_rewrite), z.Not(s.broken_unheld),
        rq.state_row == z.K(INT, z.IntVal(-1)), tb.owner == z.K(INT, z.IntVal(-1)),
        tb.newest == z.K(INT, c.smt.GARBAGE), tb.position == z.K(INT, z.IntVal(-1)),
        sl.unwritten == z.K(INT, z.BoolVal(True)), sl.released == z.K(INT, z.BoolVal(False)),
        sl.ncounts == z.K(INT, z.IntVal(0)),
        rq.status == z.K(INT, z.IntVal(int(Status.ABSENT))), rq.ndelivered == z.K(INT, z.IntVal(0)),
        rq.closed_at == z.K(INT, z.IntVal(-9)), rq.unchecked == z.K(INT, z.BoolVal(False)),
        rq.preemptions == z.K(INT, z.IntVal(0)),
        c.forall(lambda r: rq.prefill_left[r] == c.params.C - 1),
        rq.placeholders == z.K(INT, z.IntVal(0)), rq.drafts_ready == z.K(INT, z.BoolVal(False)),
    )


def bounds_of(reader: Reader, p: Params, opts: Options, n: int) -> Bounds:
    """The model bound a solver state belongs to."""
    budgets = tuple(reader.num(p.M[r]) for r in range(n))
    host_sync = tuple(r for r in range(n) if reader.flag(p.HS[r]))
    return Bounds(
        depth=opts.depth, slots=reader.num(p.K), requests=n, max_tokens=max(budgets),
        finish=opts.finish, abort=opts.abort, preempt=opts.preempt,
        preemptions=reader.num(p.P), condense=opts.condense, guard=opts.guard,
        release_at=opts.release_at, preempt_policy=opts.preempt_policy,
        prefill_chunks=reader.num(p.C), host_sync=bool(host_sync), variant=opts.variant,
        max_tokens_of=budgets if len(set(budgets)) > 1 else (),
        host_sync_of=host_sync if host_sync and host_sync != (0,) else (),
        faults=opts.faults, spec_tokens=opts.spec_tokens, state=opts.state,
        state_rows=0 if not opts.rows or reader.num(p.S) == n else reader.num(p.S),
        subsets=opts.subsets)


Hyps = list[tuple[str, Any]]
Build = Callable[[Ctx, Any], tuple[StateV, StateV | None, Hyps]]
"""A query's premises: adds the fixed ones (the initial state, the action's step) to the solver,
returns the state (and successor) they name, and the invariant's conjuncts assumed of the state,
each with its name (none for initiation)."""
Broken = Callable[[Ctx, StateV, StateV | None], list[tuple[str, Any]]]
"""A query's goals: each conjunct's name and the term saying it is broken."""


def _check(setup: Setup, build: Build, broken_of: Broken, action: str) -> tuple[str, Cti | None]:
    """The search for a counterexample (every goal in one query): "unsat" (none), "sat" with
    the counterexample, or "unknown"."""
    z = setup.smt.z
    p = fresh_params(setup.smt)
    c = setup.ctx(p)
    sol = setup.smt.solver(setup.rlimit)
    s, t, hyps = build(c, sol)
    sol.add(*assumptions(c, s), *[h for _, h in hyps])
    flags = broken_of(c, s, t)
    sol.add(z.Or(*[bad for _, bad in flags]))
    cti = None
    for _ in range(max(setup.tries, 1)):
        verdict = sol.check()
        if verdict != z.sat:
            if cti is not None:
                return "sat", cti
            return ("unsat" if verdict == z.unsat else "unknown"), None
        model = sol.model()
        rd = Reader(setup.smt, model)
        n, k = rd.num(p.N), rd.num(p.K)
        broken = [name for name, bad in flags if rd.flag(bad)]
        rows = rd.num(p.S) if setup.opts.rows else 0
        before = decode(setup.smt, model, s, n, k, rows)
        after = decode(setup.smt, model, t, n, k, rows) if t is not None else before
        bounds = bounds_of(rd, p, setup.opts, n)
        found = Cti(action, broken, before, after, bounds)
        cti = cti or found
        if setup.accept is None or setup.accept(found):
            return "sat", found
        # Not one the explorer reaches: ask for another first state.
        sol.add(z.Not(z.And(*pin(setup.smt, s, before, bounds), *pin_params(setup.smt, p, bounds))))
    return "sat", cti


CORE = ("WellFormed", "RowsNameRequests", "SlotsConsecutive", "PhasesOrdered", "LiveRowsActive")
"""The conjuncts that say what shape a state has: with them and the goal's own conjunct as the
only premises, a goal the full invariant drowns in instances is often proved in milliseconds."""

TRIES = (("all", 500), ("core", 100), ("all", 1))
"""Each query's attempts, in order: which premises (every conjunct, or the goal's own and the
`CORE`) and the share of the rlimit (1/500, 1/100, all of it). Most queries need every premise
and a moment; some need few premises and drown in all of them; the rest need both and time."""


def _prove(setup: Setup, build: Build, broken_of: Broken) -> str:
    """The proof of one obligation, one query per conjunct it must establish: "unsat" when
    none can break. Several small queries take the solver a fraction of the time of their
    disjunction (a consecution with drafts at depth 3: minutes instead of no verdict).

    Each query is tried as `TRIES` says, up to the first unsat: briefly with every premise,
    briefly with the goal's own conjunct and the `CORE` only, then with every premise and the
    whole rlimit. Fewer premises can only make a proof harder to find, never wrong (unsat with
    some premises is unsat with all), and spare the solver the instances of the rest (a finish
    with drafts at depth 3: under a second instead of minutes)."""
    z = setup.smt.z
    p = fresh_params(setup.smt)
    c = setup.ctx(p)
    base = setup.smt.solver(setup.rlimit)  # only collects the query's common part
    s, t, hyps = build(c, base)
    base.add(*assumptions(c, s))
    common = list(base.assertions())
    worst = "unsat"
    every = [h for _, h in hyps]
    for name, bad in broken_of(c, s, t):
        core = [h for n, h in hyps if n == name or n in CORE]
        tries = [(every if which == "all" else core, setup.rlimit // share)
                 for which, share in TRIES if which == "all" or len(core) < len(hyps)]
        for premises, rlimit in tries:
            # A fresh solver per query: what one query learnt only slows the next.
            sol = setup.smt.solver(rlimit)
            sol.add(*common, *premises, bad)
            found = sol.check()
            if found == z.unsat:
                break
        verdict = "unsat" if found == z.unsat else "sat" if found == z.sat else "unknown"
        if setup.record is None:
            if verdict != "unsat":
                return verdict
            continue
        setup.record.append((name, verdict))
        worst = verdict if verdict == "sat" or worst == "unsat" else worst
    return worst


def _discharge(setup: Setup, kind: str, name: str, build: Build, broken_of: Broken) -> Result:
    """Prove over every integer; where that fails, search a small domain for a counterexample
    (the proof's own model, over every integer, need not be one a reader can follow)."""
    start = time.perf_counter()
    verdict = _prove(setup, build, broken_of)
    cti = None
    if verdict == "unsat":
        verdict = "holds"
    elif setup.record is not None:
        verdict = {"sat": "fails"}.get(verdict, "unknown")
    else:
        action = name if kind == "consecution" else "init" if kind == "initiation" else "-"
        verdict, cti = _check(replace(setup, domain=SEARCH_DOMAIN), build, broken_of, action)
        verdict = {"unsat": "unknown", "sat": "fails"}.get(verdict, "unknown")
    return Result(kind, name, verdict, time.perf_counter() - start, cti)


def initiation(setup: Setup) -> Result:
    """Every initial state satisfies the invariant."""
    def build(c: Ctx, sol: Any) -> tuple[StateV, None, Hyps]:
        s = fresh_state(setup.smt, "s", setup.opts.depth)
        sol.add(initial(c, s))
        return s, None, []

    def broken(c: Ctx, s: StateV, _: StateV | None) -> list[tuple[str, Any]]:
        return [(cj.name, setup.smt.z.Not(cj.holds(c, s))) for cj in setup.invariant]

    return _discharge(setup, "initiation", "init", build, broken)


def consecution(setup: Setup, action: str) -> Result:
    """From every state satisfying the invariant, ``action`` leads to one that satisfies it."""
    def build(c: Ctx, sol: Any) -> tuple[StateV, StateV, Hyps]:
        s = fresh_state(setup.smt, "s", setup.opts.depth)
        hyps = [(cj.name, cj.holds(c, s)) for cj in setup.invariant]
        enabled, post = step(c, action, s)
        sol.add(enabled)
        return s, post, hyps

    def broken(c: Ctx, s: StateV, t: StateV | None) -> list[tuple[str, Any]]:
        assert t is not None
        return [(cj.name, setup.smt.z.Not(cj.holds(c, t))) for cj in setup.invariant]

    return _discharge(setup, "consecution", action, build, broken)


def safety(setup: Setup, invariant: Conjunct) -> Result:
    """The invariant implies one of the model's safety invariants."""
    def build(c: Ctx, sol: Any) -> tuple[StateV, None, Hyps]:
        s = fresh_state(setup.smt, "s", setup.opts.depth)
        return s, None, [(cj.name, cj.holds(c, s)) for cj in setup.invariant]

    def broken(c: Ctx, s: StateV, _: StateV | None) -> list[tuple[str, Any]]:
        return [(invariant.name, setup.smt.z.Not(invariant.holds(c, s)))]

    return _discharge(setup, "safety", invariant.name, build, broken)


def names(opts: Options) -> list[tuple[str, str]]:
    """The obligations of an option set, in order: initiation, consecution per action, safety
    per invariant."""
    return [("initiation", "init"), *(("consecution", a) for a, _ in actions(opts)),
            *(("safety", inv.name) for inv in SAFETY
              if inv.applies(opts.spec_tokens, opts.state))]


def discharge(setup: Setup, kind: str, name: str) -> Result:
    """One obligation, by its kind and name (see `names`)."""
    if kind == "initiation":
        return initiation(setup)
    if kind == "consecution":
        return consecution(setup, name)
    return safety(setup, next(inv for inv in SAFETY if inv.name == name))


def obligations(setup: Setup, jobs: int = 1) -> Iterator[Result]:
    """Every obligation of the option set, in the order of `names`; with ``jobs`` > 1, that many
    processes discharge them side by side (each query is independent of the others)."""
    todo = names(setup.opts)
    if jobs <= 1:
        yield from (discharge(setup, kind, name) for kind, name in todo)
        return
    # A worker rebuilds the setup: the solver's module does not cross processes (the explorer
    # behind ``accept`` does, and each worker keeps its own explorations).
    plan = (setup.smt.name, setup.opts, setup.conjuncts, setup.rlimit, setup.domain,
            setup.accept, setup.tries)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=ctx) as pool:
        yield from pool.map(_remote, [(plan, kind, name) for kind, name in todo])


def _remote(job: tuple[tuple[Any, ...], str, str]) -> Result:
    """`discharge` in a worker process."""
    (solver, opts, conjuncts, rlimit, domain, accept, tries), kind, name = job
    setup = Setup(Smt(solver), opts, conjuncts, rlimit, domain, accept, tries)
    return discharge(setup, kind, name)

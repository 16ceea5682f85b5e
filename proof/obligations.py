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

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from model.state import Bounds, State, Status

from .concrete import Reader, decode
from .inductive import CONJUNCTS, SAFETY, Conjunct
from .relation import Ctx, Options, actions, in_range, step
from .symbolic import Params, Smt, StateV, fresh_params, fresh_state

SEARCH_DOMAIN = 3
"""Quantifiers range below this in the search for a small counterexample: requests, rows,
slots, delivered tokens."""


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
    timeout_ms: int = 60_000
    domain: int | None = None

    def ctx(self, params: Params) -> Ctx:
        return Ctx(self.smt, params, self.opts, domain=self.domain)


def assumptions(c: Ctx, s: StateV | None = None) -> list[Any]:
    """What the option set fixes about the unbounded parameters: at least one request, a ring of
    K >= D slots (K = D - 1 for the known-bad ring), preemptions, chunks and max tokens of at
    least what the model allows; over a small domain, every count below it."""
    z, p, d = c.smt.z, c.params, c.opts.depth
    ring = d - 1 == p.K if c.opts.slots_below_depth else d <= p.K
    out = [p.N >= 1, ring, p.K >= 1, p.P >= 0, p.C >= 1,
           c.forall(lambda r: z.Implies(in_range(c, r), p.M[r] >= 1))]
    if c.domain is not None:
        out += [c.domain >= p.N, c.domain >= p.K, p.P <= 1, p.C <= 2,
                c.forall(lambda r: p.M[r] <= c.domain)]
        if s is not None:
            out += [st.nrows <= c.domain for st in s.queue]
    return out


def initial(c: Ctx, s: StateV) -> Any:
    """The initial state (`model.state.initial_state`): no ring, nothing in flight, no request
    arrived, every slot unwritten."""
    z, INT = c.smt.z, c.smt.Int
    rq, sl = s.requests, s.slots
    return z.And(
        z.Not(s.allocated), s.next_slot == 0, s.qlen == 0,
        z.Not(s.broken_read), z.Not(s.broken_rewrite),
        sl.unwritten == z.K(INT, z.BoolVal(True)), sl.released == z.K(INT, z.BoolVal(False)),
        sl.ncounts == z.K(INT, z.IntVal(0)),
        rq.status == z.K(INT, z.IntVal(int(Status.ABSENT))), rq.ndelivered == z.K(INT, z.IntVal(0)),
        rq.closed_at == z.K(INT, z.IntVal(-9)), rq.unchecked == z.K(INT, z.BoolVal(False)),
        rq.preemptions == z.K(INT, z.IntVal(0)), rq.prefill_left == z.K(INT, c.params.C - 1),
        rq.placeholders == z.K(INT, z.IntVal(0)), rq.drafts_ready == z.K(INT, z.BoolVal(False)),
    )


def bounds_of(reader: Reader, p: Params, opts: Options, n: int) -> Bounds:
    """The model bound a solver state belongs to."""
    budgets = tuple(reader.int(p.M[r]) for r in range(n))
    host_sync = tuple(r for r in range(n) if reader.bool(p.HS[r]))
    return Bounds(
        depth=opts.depth, slots=reader.int(p.K), requests=n, max_tokens=max(budgets),
        finish=opts.finish, abort=opts.abort, preempt=opts.preempt,
        preemptions=reader.int(p.P), condense=opts.condense, guard=opts.guard,
        release_at=opts.release_at, preempt_policy=opts.preempt_policy,
        prefill_chunks=reader.int(p.C), host_sync=bool(host_sync), variant=opts.variant,
        max_tokens_of=budgets if len(set(budgets)) > 1 else (),
        host_sync_of=host_sync if host_sync and host_sync != (0,) else (),
        faults=opts.faults, spec_tokens=opts.spec_tokens)


def _check(setup: Setup, build: Callable[[Ctx, Any], tuple[StateV, StateV | None]],
           broken_of: Callable[[Ctx, StateV, StateV | None], list[tuple[str, Any]]],
           action: str) -> tuple[str, Cti | None]:
    """One query: "unsat" (holds), or "sat" with its counterexample, or "unknown"."""
    z = setup.smt.z
    p = fresh_params(setup.smt)
    c = setup.ctx(p)
    sol = z.Solver()
    sol.set("timeout", setup.timeout_ms)
    s, t = build(c, sol)
    sol.add(*assumptions(c, s))
    flags = []
    for name, bad in broken_of(c, s, t):
        flag = z.Bool(f"breaks {name}")
        sol.add(flag == bad)
        flags.append((name, flag))
    sol.add(z.Or(*[f for _, f in flags]))
    verdict = sol.check()
    if verdict == z.unsat:
        return "unsat", None
    if verdict != z.sat:
        return "unknown", None
    model = sol.model()
    rd = Reader(setup.smt, model)
    n, k = rd.int(p.N), rd.int(p.K)
    broken = [name for name, f in flags if rd.bool(f)]
    before = decode(setup.smt, model, s, n, k)
    after = decode(setup.smt, model, t, n, k) if t is not None else before
    return "sat", Cti(action, broken, before, after, bounds_of(rd, p, setup.opts, n))


def _discharge(setup: Setup, kind: str, name: str,
               query: Callable[[Setup], tuple[str, Cti | None]]) -> Result:
    """Prove over every integer; where that fails, search a small domain for a counterexample."""
    start = time.perf_counter()
    verdict, cti = query(setup)
    if verdict != "unsat":
        small = Setup(setup.smt, setup.opts, setup.conjuncts, setup.timeout_ms, SEARCH_DOMAIN)
        verdict, cti = query(small)
        verdict = {"unsat": "unknown", "sat": "fails"}.get(verdict, "unknown")
    else:
        verdict = "holds"
    return Result(kind, name, verdict, time.perf_counter() - start, cti)


def initiation(setup: Setup) -> Result:
    """Every initial state satisfies the invariant."""
    def query(st: Setup) -> tuple[str, Cti | None]:
        def build(c: Ctx, sol: Any) -> tuple[StateV, None]:
            s = fresh_state(st.smt, "s", st.opts.depth)
            sol.add(initial(c, s))
            return s, None

        def broken(c: Ctx, s: StateV, _: StateV | None) -> list[tuple[str, Any]]:
            return [(cj.name, st.smt.z.Not(cj.holds(c, s))) for cj in st.conjuncts]

        return _check(st, build, broken, "init")

    return _discharge(setup, "initiation", "init", query)


def consecution(setup: Setup, action: str) -> Result:
    """From every state satisfying the invariant, ``action`` leads to one that satisfies it."""
    def query(st: Setup) -> tuple[str, Cti | None]:
        def build(c: Ctx, sol: Any) -> tuple[StateV, StateV]:
            s = fresh_state(st.smt, "s", st.opts.depth)
            sol.add(*[cj.holds(c, s) for cj in st.conjuncts])
            enabled, post = step(c, action, s)
            sol.add(enabled)
            return s, post

        def broken(c: Ctx, s: StateV, t: StateV | None) -> list[tuple[str, Any]]:
            assert t is not None
            return [(cj.name, st.smt.z.Not(cj.holds(c, t))) for cj in st.conjuncts]

        return _check(st, build, broken, action)

    return _discharge(setup, "consecution", action, query)


def safety(setup: Setup, invariant: Conjunct) -> Result:
    """The invariant implies one of the model's safety invariants."""
    def query(st: Setup) -> tuple[str, Cti | None]:
        def build(c: Ctx, sol: Any) -> tuple[StateV, None]:
            s = fresh_state(st.smt, "s", st.opts.depth)
            sol.add(*[cj.holds(c, s) for cj in st.conjuncts])
            return s, None

        def broken(c: Ctx, s: StateV, _: StateV | None) -> list[tuple[str, Any]]:
            return [(invariant.name, st.smt.z.Not(invariant.holds(c, s)))]

        return _check(st, build, broken, "-")

    return _discharge(setup, "safety", invariant.name, query)


def obligations(setup: Setup) -> Iterator[Result]:
    """Every obligation of the option set, in order: initiation, consecution per action,
    safety per invariant."""
    yield initiation(setup)
    for name, _ in actions(setup.opts):
        yield consecution(setup, name)
    for inv in SAFETY:
        yield safety(setup, inv)


@dataclass
class Lookup:
    """Where the explorer puts a counterexample's first state."""

    reachable: bool
    path: list[str] = field(default_factory=list)
    """The shortest path to it from the initial state, as action labels."""
    states: int = 0
    """States the explorer visited at the counterexample's bound."""

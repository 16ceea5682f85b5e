"""The model's variables as solver terms, of unbounded size: `ttmirror prove`'s vocabulary.

Every record of `model/state.py` becomes arrays indexed by integers: requests by request id,
rows by row number, slots by slot number. Nothing fixes how many there are: the number of
requests ``N`` and of slots ``K`` are solver constants, each step's row count is one, and a
request's delivered tokens are an array as long as its count says. Only the depth D (the
in-flight queue has D places) and the spec tokens (each row has that many draft places) are
fixed per option set. Entries past a count (rows past a step's ``nrows``, tokens past a request's
``delivered``, queue places past ``qlen``) mean nothing, as freed memory means nothing: no
relation reads them into an entry that counts.

The solver API is z3's Python API or cvc5's ``cvc5.pythonic`` (the same functions): `Smt` holds
the one in use, so the same encoding is discharged by both.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any

Term = Any
"""A solver term (z3's ExprRef or cvc5.pythonic's)."""

NONE_AT = -4
"""The token (-4, -4) and the number -9 stand for Python's None (never a token or a count)."""
NONE_INT = -9


class Smt:
    """One solver API and the sorts the encoding uses: integers, booleans, tokens, arrays."""

    def __init__(self, solver: str = "z3") -> None:
        if solver not in ("z3", "cvc5"):
            raise ValueError(f"--solver must be z3 or cvc5, got {solver!r}")
        self.name = solver
        self.z = importlib.import_module("z3" if solver == "z3" else "cvc5.pythonic")
        z = self.z
        tok = z.Datatype("Tok")
        tok.declare("tok", ("who", z.IntSort()), ("at", z.IntSort()))
        self.Tok = tok.create()
        self.Int = z.IntSort()
        self.Bool = z.BoolSort()
        self.IntArr = z.ArraySort(self.Int, self.Int)
        self.BoolArr = z.ArraySort(self.Int, self.Bool)
        self.TokArr = z.ArraySort(self.Int, self.Tok)
        self.TokArr2 = z.ArraySort(self.Int, self.TokArr)
        self.IntArr2 = z.ArraySort(self.Int, self.IntArr)
        self.PLACEHOLDER = self.tok(-1, -1)
        self.GARBAGE = self.tok(-2, -2)
        self.REJECTED = self.tok(-3, -3)
        self.NONE = self.tok(NONE_AT, NONE_AT)

    def solver(self, rlimit: int) -> Any:
        """A fresh solver that gives up ("unknown") after ``rlimit`` units of its own resource
        count per check: a bound on work, not on time, so a verdict never depends on how fast
        or how busy the machine is."""
        sol = self.z.Solver()
        if self.name == "z3":
            sol.set("rlimit", rlimit)
        else:
            sol.setOption("rlimit-per", rlimit)
            # Constant arrays and lambdas (K(...), Lambda) need the extended array theory.
            sol.setOption("arrays-exp", True)
        return sol

    def tok(self, who: Any, at: Any) -> Term:
        """The token ``(who, at)``."""
        return self.Tok.tok(who, at)

    def who(self, t: Term) -> Term:
        """A token's request."""
        return self.Tok.who(t)

    def at(self, t: Term) -> Term:
        """A token's position."""
        return self.Tok.at(t)


@dataclass(frozen=True)
class Params:
    """What the option set leaves unbounded: constants shared by a state and its successor."""

    N: Term
    """How many requests exist (ids 0..N-1)."""
    K: Term
    """Mirror slots in the ring (ids 0..K-1)."""
    M: Term
    """Per request, the tokens it generates before it finishes on its own (max_tokens)."""
    P: Term
    """How often each request may be preempted."""
    C: Term
    """Chunks of each prompt's first prefill."""
    HS: Term
    """Per request, whether it is host-sync (needs its newest token on the host)."""
    S: Term
    """With state rows: how many state rows the device holds (ids 0..S-1)."""


@dataclass(frozen=True)
class StepV:
    """One place of the in-flight queue: `model.state.Step` with its rows as arrays by row."""

    slot: Term
    src: Term
    """The previous step's slot, or NONE_INT."""
    phase: Term
    nrows: Term
    req: Term
    """Row -> request, -1 for a dropped row (DEAD_ROW)."""
    row_of: Term
    """Request -> its live row here, -1 if none: the inverse of ``req`` (a request has at most
    one row per step), kept so that per-request questions need no search over rows."""
    pos: Term
    prev: Term
    """Row -> previous-row map entry, NONE_INT for host ids."""
    consumed: Term
    """Row -> what the combine put into the input ids; NONE before."""
    partial: Term
    spec: Term
    placed: Term
    """Row -> the position the positions input gives the newest token; NONE_INT = None."""
    drafts: Term
    """Row -> draft place -> token."""
    ndrafts: Term
    """Row -> how many drafts the row's tuple holds (0 or its spec)."""
    host_copy: Term
    has_host_copy: Term
    accepted: Term
    has_accepted: Term
    host_counts: Term
    has_host_counts: Term
    idx: Term
    """With state rows: row -> its idx_mapping entry (kept by a dropped row)."""
    was: Term
    """With state rows: row -> the request it was scheduled for (kept by a dropped row, whose
    ``req`` is -1)."""
    row_at: Term
    """With state rows: state row -> the last row of this step naming it, -1 if none: the
    inverse of ``idx``, kept so that the post-update needs no search over rows."""


@dataclass(frozen=True)
class SlotsV:
    """The ring: `model.state.Slot` per slot id, as arrays by slot."""

    unwritten: Term
    """Slot -> content is None."""
    length: Term
    """Slot -> len(content) (0 once released)."""
    content: Term
    """Slot -> row -> token."""
    released: Term
    ncounts: Term
    """Slot -> len(counts) (= len(positions)): 0 without drafts or once released."""
    counts: Term
    positions: Term


@dataclass(frozen=True)
class RequestsV:
    """`model.state.Request` per request id, as arrays by request."""

    status: Term
    ndelivered: Term
    delivered: Term
    """Request -> index -> token; entries at ndelivered and past mean nothing."""
    closed_at: Term
    """NONE_INT = None."""
    unchecked: Term
    preemptions: Term
    prefill_left: Term
    placeholders: Term
    drafts_ready: Term
    state_row: Term
    """With state rows: the state row it holds, -1 if none."""


@dataclass(frozen=True)
class TableV:
    """With state rows: `model.state.StateRow` per state row, as arrays by state row."""

    owner: Term
    newest: Term
    position: Term


@dataclass(frozen=True)
class StateV:
    """A state of the whole system (`model.state.State`), of unbounded size."""

    allocated: Term
    next_slot: Term
    qlen: Term
    """How many queue places hold in-flight steps (oldest first)."""
    queue: tuple[StepV, ...]
    slots: SlotsV
    requests: RequestsV
    broken_read: Term
    """Ghost: NoReadOfReleasedOrOverwrittenSlot was broken."""
    broken_rewrite: Term
    """Ghost: NoRewriteWhileReaderOutstanding was broken."""
    table: TableV
    broken_unheld: Term
    """Ghost: NoWriteToUnheldStateRow was broken."""

    def with_(self, **changes: Any) -> StateV:
        """A copy with the named fields changed."""
        return replace(self, **changes)


_STEP_SORTS = {
    "slot": "Int", "src": "Int", "phase": "Int", "nrows": "Int", "req": "IntArr",
    "row_of": "IntArr", "pos": "IntArr", "prev": "IntArr", "consumed": "TokArr",
    "partial": "BoolArr", "spec": "IntArr", "placed": "IntArr", "drafts": "TokArr2",
    "ndrafts": "IntArr", "host_copy": "TokArr", "has_host_copy": "Bool", "accepted": "IntArr",
    "has_accepted": "Bool", "host_counts": "IntArr", "has_host_counts": "Bool",
    "idx": "IntArr", "was": "IntArr", "row_at": "IntArr",
}
_SLOT_SORTS = {
    "unwritten": "BoolArr", "length": "IntArr", "content": "TokArr2", "released": "BoolArr",
    "ncounts": "IntArr", "counts": "IntArr2", "positions": "IntArr2",
}
_REQUEST_SORTS = {
    "status": "IntArr", "ndelivered": "IntArr", "delivered": "TokArr2", "closed_at": "IntArr",
    "unchecked": "BoolArr", "preemptions": "IntArr", "prefill_left": "IntArr",
    "placeholders": "IntArr", "drafts_ready": "BoolArr", "state_row": "IntArr",
}
_TABLE_SORTS = {"owner": "IntArr", "newest": "TokArr", "position": "IntArr"}


def fresh_state(smt: Smt, name: str, depth: int) -> StateV:
    """A state of solver constants named after ``name`` (``s``, ``t``): D queue places."""
    z = smt.z

    def const(field: str, sort: str) -> Term:
        return z.Const(f"{name}.{field}", getattr(smt, sort))

    queue = tuple(
        StepV(**{f: const(f"q{q}.{f}", srt) for f, srt in _STEP_SORTS.items()})
        for q in range(depth)
    )
    return StateV(
        allocated=const("allocated", "Bool"), next_slot=const("next_slot", "Int"),
        qlen=const("qlen", "Int"), queue=queue,
        slots=SlotsV(**{f: const(f"slot.{f}", srt) for f, srt in _SLOT_SORTS.items()}),
        requests=RequestsV(**{f: const(f"req.{f}", srt) for f, srt in _REQUEST_SORTS.items()}),
        broken_read=const("broken_read", "Bool"), broken_rewrite=const("broken_rewrite", "Bool"),
        table=TableV(**{f: const(f"table.{f}", srt) for f, srt in _TABLE_SORTS.items()}),
        broken_unheld=const("broken_unheld", "Bool"),
    )


def fresh_params(smt: Smt) -> Params:
    """The option set's unbounded parameters as solver constants."""
    z = smt.z
    return Params(N=z.Int("N"), K=z.Int("K"), M=z.Const("M", smt.IntArr),
                  P=z.Int("P"), C=z.Int("C"), HS=z.Const("HS", smt.BoolArr), S=z.Int("S"))

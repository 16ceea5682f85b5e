"""Between the model's states and the solver's: a state pinned as constraints, and a solver
model read back as a `model.state.State`.

Only the entries that mean something are pinned or read (rows below a step's count, tokens
below a request's, queue places below ``qlen``); the rest stay free, as they are in the
relation.
"""

from __future__ import annotations

from typing import Any

from ..model.actions import budget, is_host_sync
from ..model.state import (
    Bounds,
    Phase,
    Request,
    Row,
    Slot,
    State,
    StateRow,
    Status,
    Step,
    Token,
    state_row_count,
)
from .symbolic import NONE_AT, NONE_INT, Params, Smt, StateV, Term


def _opt(v: int | None) -> int:
    return NONE_INT if v is None else v


def pin_params(smt: Smt, p: Params, b: Bounds) -> list[Term]:
    """The parameters a model bound sets."""
    out = [b.requests == p.N, b.slots == p.K, b.preemptions == p.P, b.prefill_chunks == p.C]
    if b.state == "rows":
        out.append(state_row_count(b) == p.S)
    for r in range(b.requests):
        out += [p.M[r] == budget(b, r), p.HS[r] == is_host_sync(b, r)]
    return out


def _tok(smt: Smt, t: Token | None) -> Term:
    return smt.NONE if t is None else smt.tok(t[0], t[1])


def domain_for(b: Bounds, *states: State) -> int:
    """A small domain (`relation.Ctx.domain`) that holds every index of bound ``b`` and of
    ``states``: requests, slots, tokens per request, rows per step."""
    rows = [len(st.rows) for s in states for st in s.queue]
    return max(b.requests, b.slots, b.max_tokens, *b.max_tokens_of, *rows) + 1


def pin(smt: Smt, v: StateV, s: State, b: Bounds) -> list[Term]:
    """Constraints that make the solver state ``v`` the model state ``s`` (meaningful entries
    only)."""
    out = [v.allocated == s.allocated, v.next_slot == s.next_slot, v.qlen == len(s.queue),
           v.broken_read == ("NoReadOfReleasedOrOverwrittenSlot" in s.broken),
           v.broken_rewrite == ("NoRewriteWhileReaderOutstanding" in s.broken)]
    rows = b.state == "rows"
    if rows:
        out.append(v.broken_unheld == ("NoWriteToUnheldStateRow" in s.broken))
        for k, entry in enumerate(s.table):
            out += [v.table.owner[k] == entry.owner, v.table.newest[k] == _tok(smt, entry.newest),
                    v.table.position[k] == entry.position]
    for q, step in enumerate(s.queue):
        st = v.queue[q]
        out += [st.slot == step.slot, st.src == _opt(step.src_slot), st.phase == int(step.phase),
                st.nrows == len(step.rows), st.has_host_copy == (step.host_copy is not None),
                st.has_accepted == bool(step.accepted),
                st.has_host_counts == bool(step.host_counts)]
        for i, row in enumerate(step.rows):
            if rows:  # a dropped row keeps its request there; the solver's is -1, `was` keeps it
                out += [st.idx[i] == row.idx, st.was[i] == row.req]
                row = row._replace(req=row.req if row.live else -1)
            out += [st.req[i] == row.req, st.pos[i] == row.pos, st.prev[i] == _opt(row.prev_row),
                    st.consumed[i] == _tok(smt, row.consumed), st.partial[i] == row.partial,
                    st.spec[i] == row.spec, st.placed[i] == _opt(row.placed),
                    st.ndrafts[i] == len(row.drafts)]
            out += [st.drafts[i][j] == _tok(smt, d) for j, d in enumerate(row.drafts)]
            if step.host_copy is not None:
                out.append(st.host_copy[i] == _tok(smt, step.host_copy[i]))
            if step.accepted:
                out.append(st.accepted[i] == step.accepted[i])
            if step.host_counts:
                out.append(st.host_counts[i] == step.host_counts[i])
        for r in range(b.requests):
            mine = [i for i, row in enumerate(step.rows) if row.live and row.req == r]
            out.append(st.row_of[r] == (mine[0] if mine else -1))
        if rows:
            for k in range(len(s.table)):
                named = [i for i, row in enumerate(step.rows) if row.idx == k]
                out.append(st.row_at[k] == (named[-1] if named else -1))
    sl = v.slots
    for k, slot in enumerate(s.slots):
        out += [sl.unwritten[k] == (slot.content is None), sl.released[k] == slot.released,
                sl.ncounts[k] == len(slot.counts)]
        if slot.content is not None:
            out.append(sl.length[k] == len(slot.content))
            out += [sl.content[k][i] == _tok(smt, t) for i, t in enumerate(slot.content)]
        out += [sl.counts[k][i] == n for i, n in enumerate(slot.counts)]
        out += [sl.positions[k][i] == n for i, n in enumerate(slot.positions)]
    rq = v.requests
    for r, req in enumerate(s.requests):
        if rows:
            out.append(rq.state_row[r] == req.state_row)
        out += [rq.status[r] == int(req.status), rq.ndelivered[r] == len(req.delivered),
                rq.closed_at[r] == _opt(req.closed_at), rq.unchecked[r] == req.unchecked,
                rq.preemptions[r] == req.preemptions, rq.prefill_left[r] == req.prefill_left,
                rq.placeholders[r] == req.placeholders, rq.drafts_ready[r] == req.drafts_ready]
        out += [rq.delivered[r][i] == _tok(smt, t) for i, t in enumerate(req.delivered)]
    return out


class Reader:
    """Reads solver terms' values out of one solver model."""

    def __init__(self, smt: Smt, model: Any) -> None:
        self.smt, self.model = smt, model

    def num(self, t: Term) -> int:
        if isinstance(t, int):
            return t
        v = self.model.eval(t, model_completion=True)
        return int(str(v))

    def flag(self, t: Term) -> bool:
        if isinstance(t, bool):
            return t
        return self.smt.z.is_true(self.model.eval(t, model_completion=True))

    def tok(self, t: Term) -> Token | None:
        who, at = self.num(self.smt.who(t)), self.num(self.smt.at(t))
        return None if (who, at) == (NONE_AT, NONE_AT) else (who, at)

    def token(self, t: Term) -> Token:
        """A token where the model has one: the None stand-in reads as itself, (-4, -4), so a
        solver state that put it there differs from every model state."""
        return self.num(self.smt.who(t)), self.num(self.smt.at(t))

    def opt(self, t: Term) -> int | None:
        v = self.num(t)
        return None if v == NONE_INT else v


def decode(smt: Smt, model: Any, v: StateV, requests: int, slots: int,
           state_rows: int = 0) -> State:
    """The model state the solver state ``v`` is in ``model``, for a bound of ``requests``
    requests and ``slots`` slots (and ``state_rows`` state rows: 0 with the ring)."""
    rd = Reader(smt, model)
    rows_mode = state_rows > 0
    queue = []
    for q in range(rd.num(v.qlen)):
        st = v.queue[q]
        rows = []
        for i in range(rd.num(st.nrows)):
            placed = rd.opt(st.placed[i])
            drafts = tuple(rd.tok(st.drafts[i][j]) for j in range(rd.num(st.ndrafts[i])))
            live = rd.num(st.req[i]) >= 0
            req = rd.num(st.was[i]) if rows_mode and not live else rd.num(st.req[i])
            rows.append(Row(req=req, pos=rd.num(st.pos[i]),
                            prev_row=rd.opt(st.prev[i]), consumed=rd.tok(st.consumed[i]),
                            live=live, partial=rd.flag(st.partial[i]),
                            spec=rd.num(st.spec[i]), placed=placed,
                            drafts=drafts,  # type: ignore[arg-type]
                            idx=rd.num(st.idx[i]) if rows_mode else -1))
        n = len(rows)
        queue.append(Step(
            slot=rd.num(st.slot), src_slot=rd.opt(st.src), phase=Phase(rd.num(st.phase)),
            rows=tuple(rows),
            host_copy=tuple(rd.token(st.host_copy[i]) for i in range(n))
            if rd.flag(st.has_host_copy) else None,
            accepted=tuple(rd.num(st.accepted[i]) for i in range(n))
            if rd.flag(st.has_accepted) else (),
            host_counts=tuple(rd.num(st.host_counts[i]) for i in range(n))
            if rd.flag(st.has_host_counts) else (),
        ))
    sl = v.slots
    slot_list = []
    for k in range(slots):
        content = None if rd.flag(sl.unwritten[k]) else tuple(
            rd.token(sl.content[k][i]) for i in range(rd.num(sl.length[k])))
        m = rd.num(sl.ncounts[k])
        # With state rows the positions go to the state rows, not to the readback.
        slot_list.append(Slot(content=content, released=rd.flag(sl.released[k]),
                              counts=tuple(rd.num(sl.counts[k][i]) for i in range(m)),
                              positions=() if rows_mode else
                              tuple(rd.num(sl.positions[k][i]) for i in range(m))))
    rq = v.requests
    reqs = []
    for r in range(requests):
        reqs.append(Request(
            status=Status(rd.num(rq.status[r])),
            delivered=tuple(rd.token(rq.delivered[r][i])
                            for i in range(rd.num(rq.ndelivered[r]))),
            closed_at=rd.opt(rq.closed_at[r]), unchecked=rd.flag(rq.unchecked[r]),
            preemptions=rd.num(rq.preemptions[r]), prefill_left=rd.num(rq.prefill_left[r]),
            placeholders=rd.num(rq.placeholders[r]), drafts_ready=rd.flag(rq.drafts_ready[r]),
            state_row=rd.num(rq.state_row[r]) if rows_mode else -1))
    flags = [("NoReadOfReleasedOrOverwrittenSlot", v.broken_read),
             ("NoRewriteWhileReaderOutstanding", v.broken_rewrite)]
    if rows_mode:
        flags.append(("NoWriteToUnheldStateRow", v.broken_unheld))
    broken = frozenset(name for name, flag in flags if rd.flag(flag))
    table = tuple(StateRow(owner=rd.num(v.table.owner[k]), newest=rd.token(v.table.newest[k]),
                           position=rd.num(v.table.position[k])) for k in range(state_rows))
    return State(allocated=rd.flag(v.allocated), next_slot=rd.num(v.next_slot),
                 queue=tuple(queue), slots=tuple(slot_list), requests=tuple(reqs),
                 broken=broken, table=table)

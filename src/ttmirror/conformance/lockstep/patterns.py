"""Which drafts are right: patterns of the drafter's guesses that let runs take every launch edge.

With drafts (spec rule 13) the model's launch chooses each row's accepted count a, every a in
0..spec; the implementation's verification accepts what its drafter and the target decide. The
probe's drafter guesses the token after `token` at `pos` by the row x = token + pos of its table:
the target's first choice where x agrees, else its second (`impl/drafts.py`). The probe's tokens
are plain decoding's, so whether the guess after request r's token at position p is the token at
p + 1 is one bit per (r, p), the bit (r, p), decided by one table row: agree[x] for greedy
sampling; for the seeded one, agree[x] when the token at p + 1 is the first choice, else its
negation. A row at position p with spec drafts accepts the leading run of true bits from p,
at most spec: a launch edge of the graph needs the bits (r, p) .. (r, p + a - 1) true and, if
a < spec, (r, p + a) false.

A pattern fixes every bit of the bound's domain (each (r, p) some launch edge reads). With
prompts whose rows x are distinct over the domain (`choose_base`), every pattern is a drafter:
its agreeing rows (`agree_for`). A run with that drafter can take exactly the launch edges the
pattern is consistent with.

The coverage problem: cover every edge of the graph with runs, each run under one pattern. A
state's requirements (`Requirements`) are the least sets of bits that some path from the
initial state to it needs (a path needs the union of its launch edges' bits, which must not
contradict). Under keep a request's positions are verified at most once per path, so the bits
a path needs never contradict; under drop (a preempted request recomputes positions it verified
before it was dropped) they may: an edge that every path reaches only through contradicting
bits is unreachable for the implementation, whose drafter is a function of (token, position),
and is reported as such (`unreachable`). Each pass of the branch walks (`branches.py`) takes
one pattern chosen greedily (`choose`): the first uncovered edge's requirement, then every
further uncovered edge's that agrees with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ttmirror.conformance.lockstep.harness import prompts_from
from ttmirror.conformance.traces.moves import Drafter
from ttmirror.impl.probe import ProbeReference, ProbeSpec, permutation
from ttmirror.model.actions import inputs_right
from ttmirror.model.explore import Exploration
from ttmirror.model.state import State

type Bit = tuple[int, int]
"""(request, position): is the drafter's guess after the token at position the next token?"""
type Need = tuple[int, int]
"""Bits as two masks over the domain's bit indices: (must be true, must be false)."""

NOTHING: Need = (0, 0)


class NoDrafter(ValueError):
    """No prompts give the bound's bits distinct rows of the drafter's table."""


def merge(a: Need, b: Need) -> Need | None:
    """Both needs at once, or None where they contradict."""
    ones, zeros = a[0] | b[0], a[1] | b[1]
    return None if ones & zeros else (ones, zeros)


def launch_bits(s: State, q: int, accepted: Sequence[int]) -> list[tuple[Bit, bool]]:
    """The bits a launch of step q with these accepted counts needs, row by row."""
    out: list[tuple[Bit, bool]] = []
    for row, a in zip(s.queue[q].rows, accepted, strict=True):
        if not (row.live and not row.partial and row.spec and inputs_right(row)):
            continue  # no verdict to choose: its count is 0 whatever the drafter guesses
        out += [((row.req, row.pos + j), True) for j in range(a)]
        if a < row.spec:
            out.append(((row.req, row.pos + a), False))
    return out


def parse_launch(label: str) -> tuple[int, tuple[int, ...]] | None:
    """(q, accepted) of a launch label with drafts ("launch(q=0, a=1,0)"), else None."""
    if not label.startswith("launch(q=") or ", a=" not in label:
        return None
    q, accepted = label[len("launch(q="):-1].split(", a=")
    return int(q), tuple(int(a) for a in accepted.split(","))


@dataclass
class Requirements:
    """What the drafter must guess to take each edge: the domain's bits, each launch edge's
    need, and each state's least needs over the paths to it."""

    bits: list[Bit]
    """The domain: bit index -> (request, position)."""
    edge_need: dict[tuple[int, int], Need]
    """(u, v) of each launch edge -> its need (every other edge needs nothing)."""
    state_needs: tuple[tuple[Need, ...], ...]
    """Per state, the least needs of the paths reaching it (empty: no path's bits agree).
    Tuples of integers: the collector stops tracking them, so a million states cost the branch
    walks' collections nothing."""

    @staticmethod
    def of(ex: Exploration) -> Requirements:
        """The requirements of an explored graph (with drafts)."""
        states = ex.states
        index: dict[Bit, int] = {}
        edge_bits: dict[tuple[int, int], list[tuple[Bit, bool]]] = {}
        labels = ex.edges.labels
        launches = {i: parsed for i, label in enumerate(labels)
                    if (parsed := parse_launch(label)) is not None}
        for u, v, lid in zip(ex.edges.src, ex.edges.dst, ex.edges.label, strict=True):
            parsed = launches.get(lid)
            if parsed is not None:
                found = launch_bits(states[u], *parsed)
                edge_bits[(u, v)] = found
                for bit, _ in found:
                    index.setdefault(bit, len(index))
        # Bits in a stable order, by request and position: a mask means the same everywhere.
        bits = sorted(index)
        index = {b: i for i, b in enumerate(bits)}
        edge_need = {}
        for edge, found in edge_bits.items():
            ones = sum(1 << index[b] for b, value in found if value)
            zeros = sum(1 << index[b] for b, value in found if not value)
            edge_need[edge] = (ones, zeros)
        return Requirements(bits, edge_need, _state_needs(ex, edge_need))

    def needs(self, u: int, v: int) -> list[Need]:
        """The least needs of the paths that walk edge (u, v)."""
        own = self.edge_need.get((u, v))
        if own is None:
            return list(self.state_needs[u])
        out = {m for c in self.state_needs[u] if (m := merge(c, own)) is not None}
        return _least(out) if len(out) > 1 else list(out)

    def unreachable(self, edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The edges no drafter lets a run take: every path to them needs contradicting bits."""
        return [e for e in edges if not self.needs(*e)]

    def allows(self, pattern: Need, u: int, v: int) -> bool:
        """Does a run under `pattern` (every bit fixed: ones, the rest false) take (u, v)?"""
        ones, zeros = self.edge_need.get((u, v), NOTHING)
        return ones & ~pattern[0] == 0 and zeros & pattern[0] == 0

    def choose(self, uncovered: Iterable[tuple[int, int]]) -> Need | None:
        """A pattern for the next pass: the first uncovered edge's least need, merged with each
        further one's that agrees; None when no uncovered edge can be taken at all."""
        pattern: Need | None = None
        every = (1 << len(self.bits)) - 1
        for u, v in uncovered:
            if pattern is not None and pattern[0] | pattern[1] == every:
                break  # every bit is fixed: nothing more can be merged
            for need in self.needs(u, v):
                merged = need if pattern is None else merge(pattern, need)
                if merged is not None:
                    pattern = merged
                    break
        return pattern

    def assignment(self, pattern: Need) -> dict[Bit, bool]:
        """Every bit of the domain under `pattern` (unfixed bits false)."""
        return {bit: bool(pattern[0] >> i & 1) for i, bit in enumerate(self.bits)}


def _least(needs: set[Need]) -> list[Need]:
    """`needs` without those that ask for more than another one does."""
    ordered = sorted(needs, key=lambda n: (bin(n[0]).count("1") + bin(n[1]).count("1"), n))
    out: list[Need] = []
    for n in ordered:
        if not any(m[0] & ~n[0] == 0 and m[1] & ~n[1] == 0 for m in out):
            out.append(n)
    return out


def _state_needs(ex: Exploration, edge_need: dict[tuple[int, int], Need]
                 ) -> tuple[tuple[Need, ...], ...]:
    """Each state's least needs, over the DAG in topological order (Kahn's)."""
    n = len(ex.states)
    src, dst = ex.edges.src, ex.edges.dst
    start = array("i", bytes(4 * (n + 1)))
    for u in src:
        start[u + 1] += 1
    for i in range(n):
        start[i + 1] += start[i]
    fill = array("i", start)
    succ = array("i", bytes(4 * len(src)))
    indegree = array("i", bytes(4 * n))
    for u, v in zip(src, dst, strict=True):
        succ[fill[u]] = v
        fill[u] += 1
        indegree[v] += 1
    needs: list[set[Need]] = [set() for _ in range(n)]
    needs[0].add(NOTHING)
    ready = [u for u in range(n) if indegree[u] == 0]
    while ready:
        u = ready.pop()
        least = _least(needs[u]) if len(needs[u]) > 1 else list(needs[u])
        needs[u] = set(least)
        for i in range(start[u], start[u + 1]):
            v = succ[i]
            own = edge_need.get((u, v), NOTHING)
            for c in least:
                m = merge(c, own) if own != NOTHING else c
                if m is not None:
                    needs[v].add(m)
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return tuple(tuple(sorted(s)) for s in needs)


# --- from a pattern to a drafter -----------------------------------------------------------------

def sequences(probe: ProbeSpec, prompts: Sequence[int], length: int) -> list[list[int]]:
    """Each request's tokens 0..length (the prompt's last token first)."""
    ref = ProbeReference(probe)
    return [[p, *ref.sequence(p, length, request=r)] for r, p in enumerate(prompts)]


def rows_of(probe: ProbeSpec, tokens: list[list[int]], bits: Iterable[Bit]
            ) -> dict[Bit, tuple[int, bool]]:
    """Per bit, its table row x and whether the target's token there is x's first choice."""
    perm = permutation(probe)
    out = {}
    for r, p in bits:
        x = tokens[r][p] + p
        out[(r, p)] = (x, perm[x % probe.vocab] == tokens[r][p + 1])
    return out


def distinct(probe: ProbeSpec, prompts: Sequence[int], bits: Sequence[Bit]) -> bool:
    """Are the bits' table rows distinct (so that every pattern is a drafter)?"""
    length = max((p for _, p in bits), default=0) + 2
    rows = rows_of(probe, sequences(probe, prompts, length), bits)
    xs = [x for x, _ in rows.values()]
    return len(set(xs)) == len(xs) and all(x < probe.vocab + probe.max_positions for x in xs)


def probe_for(sampling: str, base: int) -> ProbeSpec:
    """The probe of a lockstep run with this sampler, seeded by its base (as `Lockstep`)."""
    return ProbeSpec(sampling=base if sampling == "seeded" else None)


def choose_base(sampling: str, requests: int, bits: Sequence[Bit], start: int) -> int:
    """The first base from `start` on (mod the vocabulary) whose prompts (`prompts_from`) and
    sampler give the bits distinct rows; ValueError if none does."""
    vocab = ProbeSpec().vocab
    for i in range(vocab):
        base = (start + i) % vocab
        if distinct(probe_for(sampling, base), prompts_from(base, requests), bits):
            return base
    raise NoDrafter(f"no prompts give the {len(bits)} drafter guesses of the bound distinct "
                    "rows of the drafter's table, so not every pattern of right and wrong "
                    "guesses is a drafter")


def drafter_for(sampling: str, base: int, requests: int, assignment: dict[Bit, bool]
                ) -> Drafter:
    """The drafter of a run (prompts from `base`, this sampler) that guesses right exactly at
    the true bits of `assignment`."""
    probe = probe_for(sampling, base)
    return Drafter(agree=agree_for(probe, prompts_from(base, requests), assignment))


def agree_for(probe: ProbeSpec, prompts: Sequence[int], assignment: dict[Bit, bool]
              ) -> tuple[int, ...]:
    """The agreeing rows of a drafter that guesses right exactly at the true bits (the rows
    must be distinct: `distinct`)."""
    length = max((p for _, p in assignment), default=0) + 2
    rows = rows_of(probe, sequences(probe, prompts, length), assignment)
    agree = {x for bit, (x, first) in rows.items() if assignment[bit] == first}
    return tuple(sorted(agree))

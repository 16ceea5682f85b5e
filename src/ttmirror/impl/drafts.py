"""Speculative decoding's numerics on the probe (spec rule 13): the drafter, the verification,
and what a step with drafts yields. Pure references: what every backend's device drafter and
verification must reproduce token for token.

    draft(token, pos)  = perm[x mod V]        if x agrees      (x = token + pos)
                         perm[(x + 1) mod V]  otherwise        (the target's second choice)
    drafts after the newest token n at p:  d1 = draft(n, p), d(i+1) = draft(d(i), p + i)
    verification of [n, d1 .. dK] at [p .. p+K]:
        t(i) = the target's token after input i at position p+i, drawn as plain decoding draws
               it there (the draw of (request, p+i))
        a    = how many leading drafts equal the target's token before them: d(i+1) = t(i)
        the row yields t(0) .. t(a): the accepted drafts and the target's token after them

The drafter is a second one-hot table of the probe's shape, so a device computes it with the
target's own ops (gather and argmax); which rows agree is a fixed seeded subset (or a set given
row by row, `DraftSpec.agree`), so acceptance varies from row to row and step to step.
Verification compares each draft with the target's own token at that position, sampled with the
draw keyed by (request, position): greedy, it is exact (the yielded tokens are plain greedy
decoding's); seeded, it is rejection sampling for a deterministic drafter (accept with the
target's probability of the draft, else the target's token given that it is not the draft),
coupled to the same draw, so seeded decoding with drafts gives exactly the tokens seeded decoding
gives without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .probe import FIRST, ProbeReference, ProbeSpec, permutation


@dataclass(frozen=True)
class DraftSpec:
    """The drafter: how many drafts a decoding row carries, and how often they are right."""

    k: int = 1
    """K spec tokens per decoding row (1 or 2)."""
    agreement: float = 0.6
    """Share of the table's rows where the drafter proposes the target's first choice."""
    seed: int = 1
    """Which rows agree (a seeded subset, fixed for the run)."""
    agree: frozenset[int] | None = None
    """The agreeing rows themselves, where given (then `agreement` and `seed` are unused): a
    drafter whose right and wrong guesses are chosen row by row. None: the seeded share."""

    def __post_init__(self) -> None:
        if self.k not in (1, 2):
            raise ValueError(f"spec tokens K must be 1 or 2, got {self.k}")
        if not 0.0 <= self.agreement <= 1.0:
            raise ValueError(f"draft agreement must be in [0, 1], got {self.agreement}")
        if self.agree is not None:
            object.__setattr__(self, "agree", frozenset(self.agree))
            if any(x < 0 for x in self.agree):
                raise ValueError("draft agreeing rows must be table rows, 0 or more")


def agreeing_rows(probe: ProbeSpec, drafts: DraftSpec) -> torch.Tensor:
    """[V + P] bool: the table rows where the drafter proposes the target's first choice."""
    rows = probe.vocab + probe.max_positions
    if drafts.agree is not None:
        outside = [x for x in drafts.agree if x >= rows]
        if outside:
            raise ValueError(f"draft agreeing row {min(outside)} is outside the table's {rows} "
                             "rows")
        return torch.tensor([x in drafts.agree for x in range(rows)], dtype=torch.bool)
    generator = torch.Generator().manual_seed(drafts.seed)
    return torch.rand(rows, generator=generator) < drafts.agreement


def draft_table(probe: ProbeSpec, drafts: DraftSpec) -> torch.Tensor:
    """[V + P, V] float32 one-hot: row x holds FIRST at the drafter's proposal for row x."""
    perm = permutation(probe)
    agree = agreeing_rows(probe, drafts)
    rows = probe.vocab + probe.max_positions
    table = torch.zeros(rows, probe.vocab, dtype=torch.float32)
    proposal = [perm[(x if agree[x] else x + 1) % probe.vocab] for x in range(rows)]
    table[torch.arange(rows), torch.tensor(proposal)] = FIRST
    return table


class DraftReference:
    """Pure-Python numerics of drafting and verification on the probe."""

    def __init__(self, probe: ProbeSpec, drafts: DraftSpec) -> None:
        self.target = ProbeReference(probe)
        self.spec = drafts
        self._perm = permutation(probe)
        self._agree = [bool(v) for v in agreeing_rows(probe, drafts)]

    def draft(self, token: int, pos: int) -> int:
        """The drafter's proposal for the token after `token` at position `pos`."""
        self.target._check(token, pos)
        x = token + pos
        return self._perm[(x if self._agree[x] else x + 1) % self.target.spec.vocab]

    def propose(self, newest: int, pos: int) -> tuple[int, ...]:
        """The K drafts after the newest token `newest` at position `pos`: for pos+1 .. pos+K."""
        out: list[int] = []
        token = newest
        for i in range(self.spec.k):
            token = self.draft(token, pos + i)
            out.append(token)
        return tuple(out)

    def verify(self, newest: int, pos: int, drafts: tuple[int, ...], request: int = 0
               ) -> tuple[int, ...]:
        """What a row with inputs [newest, *drafts] at [pos ..] yields: t(0) .. t(a)."""
        inputs = (newest, *drafts)
        out: list[int] = []
        for i, token in enumerate(inputs):
            target = self.target.next_token(token, pos + i, request)
            out.append(target)
            if i == len(drafts) or drafts[i] != target:
                break  # the next draft is rejected, or none is left: t(i) is the last token
        return tuple(out)

    def sequence(self, prompt: int, length: int, request: int = 0) -> tuple[list[int], list[int]]:
        """Tokens 1..length with drafts, as a run of sync steps makes them (the prefill carries
        none), and each drafted step's accepted count; runs past `length` are cut there."""
        tokens: list[int] = []
        accepted: list[int] = []
        newest, pos = prompt, 0
        drafts: tuple[int, ...] = ()
        while len(tokens) < length:
            run = self.verify(newest, pos, drafts, request)
            if drafts:
                accepted.append(len(run) - 1)
            tokens.extend(run)
            pos += len(run)
            newest = run[-1]
            drafts = self.propose(newest, pos)
        return tokens[:length], accepted

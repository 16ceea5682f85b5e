"""Allowed-token constraints computed on the host from a request's tokens so far.

A constraint is a small finite-state grammar: its state is a function of the request's newest
token, so the host needs that token before it can build the next step's mask. A constrained
request is therefore host-sync (`Runner.arrive(host_sync=True)`): it never takes a depth-2 step
while a step of it is in flight, and its mask is built from the host's authoritative tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Grammar(Protocol):
    name: str

    def allowed(self, tokens: Sequence[int], vocab: int) -> frozenset[int]:
        """The ids the next token may take, given the request's tokens so far (prompt first)."""
        ...


class AlternatingParity:
    """Each token's parity differs from the previous token's: a two-state grammar."""

    name = "alternating-parity"

    def allowed(self, tokens: Sequence[int], vocab: int) -> frozenset[int]:
        want = 1 - tokens[-1] % 2
        return frozenset(range(want, vocab, 2))


GRAMMARS: dict[str, Grammar] = {g.name: g for g in (AlternatingParity(),)}
"""The constraints a request may name."""

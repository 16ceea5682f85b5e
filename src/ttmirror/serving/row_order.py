"""Row-order policies: where each scheduled request's row lands in the next step.

The mirror must not care: a request's previous-step row is found through the previous-row map
whatever its row is now. These policies make the serving loop move rows between consecutive
steps, so the battery meets what a real engine does (vLLM's persistent batch condenses on
removal; a scheduler may sort by priority) and not only the by-id order.

- `by-id`: ascending request id (rows shift only when a request enters or leaves);
- `reversed`: descending request id (an arrival shifts every row after it);
- `shuffle`: a seeded shuffle per step (every row may move at every step);
- `condense`: vLLM's `InputBatch.condense`: a request keeps its row while it is scheduled; a
  request that leaves opens a hole, filled by the request in the last row; new requests
  take the rows after the last one.
"""

from __future__ import annotations

import random

from .engine import Order

POLICIES = ("by-id", "reversed", "shuffle", "condense")


class Shuffle:
    """A seeded shuffle of the eligible requests, drawn anew for each step."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, eligible: list[int]) -> list[int]:
        rows = sorted(eligible)
        self.rng.shuffle(rows)
        return rows


class Condense:
    """vLLM's persistent batch: holes left by departed requests are filled from the end."""

    def __init__(self) -> None:
        self.layout: list[int] = []
        """The rows of the last step, in order."""

    def __call__(self, eligible: list[int]) -> list[int]:
        staying = set(eligible)
        rows: list[int | None] = [r if r in staying else None for r in self.layout]
        # Fill each hole, lowest first, with the request in the last occupied row after it.
        last = len(rows) - 1
        for hole in range(len(rows)):
            if rows[hole] is not None:
                continue
            while last > hole and rows[last] is None:
                last -= 1
            if last <= hole:
                break
            rows[hole], rows[last] = rows[last], None
        kept = [r for r in rows if r is not None]
        placed = set(kept)
        self.layout = kept + [r for r in sorted(eligible) if r not in placed]
        return self.layout


def row_order(policy: str, seed: int = 0) -> Order:
    """The row-order policy named `policy` (`POLICIES`); ValueError naming the choices."""
    if policy == "by-id":
        return sorted
    if policy == "reversed":
        return lambda eligible: sorted(eligible, reverse=True)
    if policy == "shuffle":
        return Shuffle(seed)
    if policy == "condense":
        return Condense()
    raise ValueError(f"unknown row order {policy!r}; choose one of: {', '.join(POLICIES)}")

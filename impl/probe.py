"""The probe model: a decode step whose next token is a known function of (input token, position).

    next_token(token, pos) = perm[(token + pos) mod V]

`perm` is a fixed seeded permutation of the vocabulary, so for a fixed position the map from the
input token to the output is a bijection: any stale input id (a placeholder, the previous step's
token, a row read at the wrong index) yields a different output, and the error propagates to
every later token of that request. That is what makes an end-to-end token comparison a real
check of the mirrored ids.

On a device the step is `add(ids, positions)` -> `embedding(., table)` -> `argmax(., dim=-1)`:
each table row is one-hot logits, so the argmax is the sampled token (greedy, deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ProbeSpec:
    vocab: int = 64
    """V: token ids are in [0, V)."""
    max_positions: int = 256
    """P: positions are in [0, P); the table has V + P rows so `token + pos` needs no modulo."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 2 or self.max_positions < 1:
            raise ValueError(f"probe needs vocab >= 2 and max_positions >= 1, got {self}")


def permutation(spec: ProbeSpec) -> list[int]:
    generator = torch.Generator().manual_seed(spec.seed)
    return [int(v) for v in torch.randperm(spec.vocab, generator=generator)]


def logits_table(spec: ProbeSpec) -> torch.Tensor:
    """[V + P, V] float32: row x is one-hot at perm[x mod V] (the embedding the device reads)."""
    perm = permutation(spec)
    rows = spec.vocab + spec.max_positions
    table = torch.zeros(rows, spec.vocab, dtype=torch.float32)
    targets = torch.tensor([perm[x % spec.vocab] for x in range(rows)])
    table[torch.arange(rows), targets] = 1.0
    return table


class ProbeReference:
    """Pure-Python numerics of the probe: what every backend must reproduce token for token."""

    def __init__(self, spec: ProbeSpec) -> None:
        self.spec = spec
        self._perm = permutation(spec)

    def next_token(self, token: int, pos: int) -> int:
        self._check(token, pos)
        return self._perm[(token + pos) % self.spec.vocab]

    def sequence(self, prompt: int, length: int) -> list[int]:
        """Tokens 1..length generated from the prompt's last token (position 0)."""
        out: list[int] = []
        token = prompt
        for pos in range(length):
            token = self.next_token(token, pos)
            out.append(token)
        return out

    def _check(self, token: int, pos: int) -> None:
        if not 0 <= token < self.spec.vocab:
            raise ValueError(f"token {token} outside the probe vocabulary [0, {self.spec.vocab})")
        if not 0 <= pos < self.spec.max_positions:
            raise ValueError(
                f"position {pos} outside [0, {self.spec.max_positions}): raise max_positions"
            )


UINT32_MASK = 0xFFFFFFFF


def forward_torch(table: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The device step in torch (the cpu backend): argmax(embedding(ids + positions)).

    The sum wraps as uint32 does on a device (a -1 placeholder plus position p reads row p-1,
    a wrong token rather than a crash); indices past the table, which only never-used rows can
    hold, are clamped.
    """
    index = ((ids + positions) & UINT32_MASK).clamp(max=table.shape[0] - 1)
    logits = torch.nn.functional.embedding(index.to(torch.int64), table)
    return torch.argmax(logits, dim=-1)

"""The probe model: a decode step whose next token is a known function of (input token, position).

    greedy:  next_token(token, pos) = perm[x mod V]                      where x = token + pos
    seeded:  next_token(token, pos) = perm[(x + c) mod V], c in {0, 1} drawn from
             (sampling seed, request, pos): the request's draw, never the row's or the step's

`perm` is a fixed seeded permutation of the vocabulary. Row x of the logits table holds 1 at
perm[x mod V], 127/128 at perm[(x + 1) mod V] (both exact in bfloat16) and 0 elsewhere: argmax
takes the first; the seeded sampler (top-k 2) takes either, about evenly, by its draw. For a
fixed position and draw, the map from the input token to the output is a bijection, so any stale
input id (a placeholder, the previous step's token, a row read at the wrong index) yields a
different output, and the error propagates to every later token of that request; and a draw
keyed by anything but (request, position) yields a different output wherever it picks the other
choice. That is what makes an end-to-end token comparison a real check of the mirrored ids and
of the sampler's keying.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample_rows, seeded_sample


@dataclass(frozen=True)
class ProbeSpec:
    vocab: int = 64
    """V: token ids are in [0, V)."""
    max_positions: int = 256
    """P: positions are in [0, P); the table has V + P rows so `token + pos` needs no modulo."""
    seed: int = 0
    sampling: int | None = None
    """The seeded sampler's seed (top-k 2 over the table's two choices); None: greedy argmax."""

    def __post_init__(self) -> None:
        if self.vocab < 2 or self.max_positions < 1:
            raise ValueError(f"probe needs vocab >= 2 and max_positions >= 1, got {self}")


def permutation(spec: ProbeSpec) -> list[int]:
    generator = torch.Generator().manual_seed(spec.seed)
    return [int(v) for v in torch.randperm(spec.vocab, generator=generator)]


SAMPLING_K = 2
"""Top-k of the seeded probe: exactly the table's two choices."""


FIRST, SECOND = 1.0, 127 / 128
"""The two choices' logits: distinct, so the order is strict; close, so the draw is even."""


def logits_table(spec: ProbeSpec) -> torch.Tensor:
    """[V + P, V] float32: row x holds FIRST at perm[x mod V], SECOND at perm[(x + 1) mod V]."""
    perm = permutation(spec)
    rows = spec.vocab + spec.max_positions
    table = torch.zeros(rows, spec.vocab, dtype=torch.float32)
    x = torch.arange(rows)
    table[x, torch.tensor([perm[(i + 1) % spec.vocab] for i in range(rows)])] = SECOND
    table[x, torch.tensor([perm[i % spec.vocab] for i in range(rows)])] = FIRST
    return table


class ProbeReference:
    """Pure-Python numerics of the probe: what every backend must reproduce token for token."""

    def __init__(self, spec: ProbeSpec) -> None:
        self.spec = spec
        self._perm = permutation(spec)

    def next_token(self, token: int, pos: int, request: int = 0) -> int:
        """The token after `token` at position `pos` (of `request`, for the seeded sampler)."""
        self._check(token, pos)
        x = token + pos
        if self.spec.sampling is None:
            return self._perm[x % self.spec.vocab]
        values = logits_table(self.spec)[x].to(torch.bfloat16)  # what the device samples from
        return seeded_sample(
            values, torch.arange(self.spec.vocab), SAMPLING_K, 1.0, 1.0,
            seed=self.spec.sampling, request=request, position=pos,
        )

    def sequence(self, prompt: int, length: int, request: int = 0) -> list[int]:
        """Tokens 1..length generated from the prompt's last token (position 0)."""
        out: list[int] = []
        token = prompt
        for pos in range(length):
            token = self.next_token(token, pos, request)
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


def sample_torch(table: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                 requests: torch.Tensor, seed: int) -> torch.Tensor:
    """The seeded device step in torch: the table rows (as bfloat16, what the device samples
    from) drawn top-k 2 with each row's (request, position) draw. An index past the table (a
    placeholder) gives an all-zero row, as the device's one-hot matmul does."""
    rows = ids.shape[0]
    index = (ids + positions) & UINT32_MASK
    values = torch.zeros(rows, table.shape[1], dtype=torch.bfloat16)
    inside = index < table.shape[0]
    values[inside] = table[index[inside].to(torch.int64)].to(torch.bfloat16)
    indices = torch.arange(table.shape[1]).repeat(rows, 1)
    return sample_rows(
        values.reshape(1, 1, rows, -1), indices.reshape(1, 1, rows, -1),
        torch.full((rows,), SAMPLING_K), torch.ones(rows), torch.ones(rows),
        seed=seed, requests=requests, positions=positions,
    ).reshape(-1)

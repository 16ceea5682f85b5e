"""The seeded sampler in torch: what the cpu backend and the probe's reference draw with, and
what the emulated `ttnn.sampling` computes (its golden function is a stub), so the backends agree
token for token. A chip's `ttnn.sampling` draws with its own generator.

The randomness of one sampled token depends on (seed, request, position) only: never on the row
a request occupies nor on the step that happens to run it. (Upstream, aligning the device RNG to
a lagging host position made seeded output timing-dependent; this is the class of bug to avoid.)
Otherwise it follows the op's documented algorithm: scale logits by `temp` (1/T), keep the top-k,
softmax, keep the nucleus of mass `p`, then draw multinomially with the uniform below.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sampling_uniform(seed: int, request: int, position: int) -> float:
    """The uniform draw in [0, 1) for the token at `position` of `request` under `seed`."""
    x = _splitmix64(
        _splitmix64(_splitmix64(seed & _MASK64) ^ (request & _MASK64)) ^ (position & _MASK64)
    )
    return (x >> 11) / float(1 << 53)


def seeded_sample(
    values: torch.Tensor,
    indices: torch.Tensor,
    k: int,
    p: float,
    temp: float,
    *,
    seed: int,
    request: int,
    position: int,
) -> int:
    """One row of `ttnn.sampling`: the sampled entry of `indices`, drawn from `values` (logits)."""
    scaled = values.float() * float(temp)
    order = torch.sort(scaled, descending=True, stable=True).indices[: max(1, int(k))]
    probs = torch.softmax(scaled[order], dim=0)
    before = torch.cumsum(probs, dim=0) - probs
    keep = max(1, int((before < float(p)).sum()))  # the nucleus: mass before each entry below p
    probs = probs[:keep] / probs[:keep].sum()
    cumulative = torch.cumsum(probs, dim=0)
    u = sampling_uniform(seed, request, position)
    chosen = min(int((cumulative <= u).sum()), keep - 1)
    return int(indices[order[chosen]])


def sample_rows(
    values: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    p: torch.Tensor,
    temp: torch.Tensor,
    *,
    seed: int,
    requests: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """All rows of a [1, 1, rows, W] sampling call; row r is request `requests[r]`."""
    rows = values.shape[-2]
    flat_values = values.reshape(rows, -1)
    flat_indices = indices.reshape(rows, -1)
    out = [
        seeded_sample(
            flat_values[r],
            flat_indices[r],
            int(k.reshape(-1)[r]),
            float(p.reshape(-1)[r]),
            float(temp.reshape(-1)[r]),
            seed=seed,
            request=int(requests.reshape(-1)[r]),
            position=int(positions.reshape(-1)[r]),
        )
        for r in range(rows)
    ]
    return torch.tensor(out, dtype=torch.int64).reshape(1, 1, 1, rows)

"""The configurations the lockstep runs the tt mirror in (torch-free: the CLI checks names early).

- ``eager-2cq``: compute on CQ0, readback on CQ1, ordered by events (the default);
- ``eager-1cq``: a device opened with one queue: everything on CQ0, in queue order;
- ``traced``: the decode step captured once per slot at load, replayed by every launch (how a
  chip deployment runs);
- ``host``: the cpu backend's only one (no queues, no traces).
"""

from __future__ import annotations

CONFIGS: dict[str, tuple[str, ...]] = {"tt": ("eager-2cq", "eager-1cq", "traced"), "cpu": ("host",)}
"""The configurations each backend runs in; the first is the default."""


def check_config(backend: str, config: str | None) -> str:
    """`config`, or the backend's default; ValueError in one line if the backend has no such."""
    chosen = config or CONFIGS[backend][0]
    if chosen not in CONFIGS[backend]:
        raise ValueError(f"the {backend} backend has no configuration {chosen!r}; choose one of: "
                         f"{', '.join(CONFIGS[backend])}")
    return chosen

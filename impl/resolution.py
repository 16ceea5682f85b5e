"""Engine-level resolution of async scheduling, as in the engine's model loader.

runner_supports_async()   <- the backend's supports_async_sampled_token_readback()
async_scheduling = auto   -> on iff the runner supports it
                   on     -> on; an error if the runner does not support it
                   off    -> off
max_concurrent_batches()  -> 2 when on, 1 when off (the depth of the step queue)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .backend import Backend


class AsyncScheduling(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class AsyncSchedulingUnsupported(ValueError):
    """async_scheduling=on was asked of a backend that cannot mirror sampled ids on device."""


def runner_supports_async(backend: Backend) -> bool:
    """The runner can pipeline two steps only if the backend combines sampled ids on device."""
    return backend.supports_async_sampled_token_readback()


def resolve_async_scheduling(
    mode: str | AsyncScheduling, supports_async: bool, backend: str = "?"
) -> bool:
    """Whether async scheduling is on, from the requested mode and the runner's capability."""
    try:
        chosen = AsyncScheduling(str(mode).lower())
    except ValueError:
        raise ValueError(f"async_scheduling must be one of auto, on, off; got {mode!r}") from None
    if chosen is AsyncScheduling.OFF:
        return False
    if chosen is AsyncScheduling.AUTO:
        return supports_async
    if not supports_async:
        raise AsyncSchedulingUnsupported(
            f"async_scheduling=on, but backend {backend!r} does not support async sampled-token "
            "readback (supports_async_sampled_token_readback() is False): it cannot combine the "
            "previous step's sampled ids on device. Use async_scheduling=auto or off, or a "
            "backend that mirrors sampled ids (cpu, tt)."
        )
    return True


@dataclass(frozen=True)
class SchedulingConfig:
    """The resolved decision for one loaded engine."""

    backend: str
    requested: AsyncScheduling
    supports_async: bool
    enabled: bool

    def async_scheduling_enabled(self) -> bool:
        return self.enabled

    def max_concurrent_batches(self) -> int:
        return 2 if self.enabled else 1


def resolve(backend: Backend, async_scheduling: str | AsyncScheduling = "auto") -> SchedulingConfig:
    supports = runner_supports_async(backend)
    enabled = resolve_async_scheduling(async_scheduling, supports, backend.name)
    return SchedulingConfig(
        backend=backend.name,
        requested=AsyncScheduling(str(async_scheduling).lower()),
        supports_async=supports,
        enabled=enabled,
    )

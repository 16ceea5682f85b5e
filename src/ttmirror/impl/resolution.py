"""Engine-level resolution of async scheduling, as in the engine's model loader.

runner_supports_async()   <- the backend's supports_async_sampled_token_readback()
async_scheduling = auto   -> on iff the runner supports it
                   on     -> on; an error if the runner does not support it
                   off    -> off
max_concurrent_batches()  -> 2 when on, 1 when off (the depth of the step queue)

With a speculative config (spec_tokens K > 0) the runner supports async scheduling only if the
backend's combine is also draft-aware (`supports_draft_aware_combine()`): the newest token, its
position and its drafts come from the device while a step is in flight (spec rule 13). Without
that, auto resolves off, as the seed engine keeps async input-combine off whenever a speculative
config is present, and on is an error.
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


def runner_supports_async(backend: Backend, spec_tokens: int = 0) -> bool:
    """The runner can pipeline two steps only if the backend combines sampled ids on device,
    and with drafts only if that combine is draft-aware."""
    if not backend.supports_async_sampled_token_readback():
        return False
    return spec_tokens == 0 or backend.supports_draft_aware_combine()


def resolve_async_scheduling(
    mode: str | AsyncScheduling, supports_async: bool, backend: str = "?",
    *, spec_tokens: int = 0, draft_aware: bool = False,
) -> bool:
    """Whether async scheduling is on, from the requested mode and the runner's capability
    (`supports_async`: sampled ids mirrored; `draft_aware`: drafts too, needed when
    `spec_tokens` > 0)."""
    try:
        chosen = AsyncScheduling(str(mode).lower())
    except ValueError:
        raise ValueError(f"async_scheduling must be one of auto, on, off; got {mode!r}") from None
    if spec_tokens < 0:
        raise ValueError(f"spec_tokens must be 0 or more, got {spec_tokens}")
    if chosen is AsyncScheduling.OFF:
        return False
    drafts_ok = spec_tokens == 0 or draft_aware
    if chosen is AsyncScheduling.AUTO:
        return supports_async and drafts_ok
    if supports_async and not drafts_ok:
        raise AsyncSchedulingUnsupported(
            f"async_scheduling=on with {spec_tokens} spec token(s), but backend {backend!r} "
            "has no draft-aware combine (supports_draft_aware_combine() is False): while a "
            "step is in flight the host knows neither a request's newest token, nor its "
            "position, nor its drafts. Use async_scheduling=auto or off, or spec_tokens=0."
        )
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
    spec_tokens: int = 0
    """K drafts per decoding row asked for (0: no speculative config)."""
    draft_aware: bool = False
    """The backend's combine takes the newest token, position and drafts from the device."""

    def async_scheduling_enabled(self) -> bool:
        return self.enabled

    def max_concurrent_batches(self) -> int:
        return 2 if self.enabled else 1


def resolve(backend: Backend, async_scheduling: str | AsyncScheduling = "auto",
            spec_tokens: int = 0) -> SchedulingConfig:
    """The decision for ``backend`` under the requested mode and speculative config."""
    supports = runner_supports_async(backend)
    draft_aware = supports and backend.supports_draft_aware_combine()
    enabled = resolve_async_scheduling(async_scheduling, supports, backend.name,
                                       spec_tokens=spec_tokens, draft_aware=draft_aware)
    return SchedulingConfig(
        backend=backend.name,
        requested=AsyncScheduling(str(async_scheduling).lower()),
        supports_async=supports,
        enabled=enabled,
        spec_tokens=spec_tokens,
        draft_aware=draft_aware,
    )

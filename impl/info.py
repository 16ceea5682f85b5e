"""What `ttmirror info --backend NAME --json` reports about a backend (no device is opened)."""

from __future__ import annotations

from typing import Any

from .backend import get_backend
from .resolution import resolve


def backend_info(name: str, async_scheduling: str = "auto") -> dict[str, Any]:
    """{"backend", "device", "supports_async_sampled_token_readback", "async_scheduling",
    "async_scheduling_enabled", "max_concurrent_batches", "details"} for backend `name`."""
    backend = get_backend(name)
    scheduling = resolve(backend, async_scheduling)
    return {
        "backend": backend.name,
        "device": backend.device_kind(),
        "supports_async_sampled_token_readback": scheduling.supports_async,
        "async_scheduling": str(scheduling.requested),
        "async_scheduling_enabled": scheduling.async_scheduling_enabled(),
        "max_concurrent_batches": scheduling.max_concurrent_batches(),
        "details": backend.info(),
    }

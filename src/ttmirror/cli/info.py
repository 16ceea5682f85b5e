"""What `ttmirror info --backend NAME --json` reports about a backend.

No chip is opened. For the tt backend, the ttnn ops of one steady decode step are listed with the
documented rule each argument satisfies; they are found by running three steps of the mirror on
an emulated device (`emulator/calls.py`), and are the same calls a chip would get.
"""

from __future__ import annotations

from typing import Any

from ttmirror.impl.backend import get_backend
from ttmirror.impl.resolution import resolve


def backend_info(name: str, async_scheduling: str = "auto",
                 spec_tokens: int = 0) -> dict[str, Any]:
    """{"backend", "device", "supports_async_sampled_token_readback",
    "supports_draft_aware_combine", "spec_tokens", "async_scheduling",
    "async_scheduling_enabled", "max_concurrent_batches", "details"}, and for tt "ops" and
    "commands_per_step", for backend `name`."""
    backend = get_backend(name)
    scheduling = resolve(backend, async_scheduling, spec_tokens)
    info: dict[str, Any] = {
        "backend": backend.name,
        "device": backend.device_kind(),
        "supports_async_sampled_token_readback": scheduling.supports_async,
        "supports_draft_aware_combine": scheduling.draft_aware,
        "spec_tokens": scheduling.spec_tokens,
        "async_scheduling": str(scheduling.requested),
        "async_scheduling_enabled": scheduling.async_scheduling_enabled(),
        "max_concurrent_batches": scheduling.max_concurrent_batches(),
        "details": backend.info(),
    }
    if name == "tt":
        from ttmirror.emulator.calls import step_calls

        # With spec tokens and a draft-aware combine: a steady step with drafts.
        k = scheduling.spec_tokens if scheduling.draft_aware else 0
        eager, traced = step_calls(spec_tokens=k), step_calls(trace=True, spec_tokens=k)
        info["ops"] = eager["ops"]
        info["commands_per_step"] = {
            mode: {"device_commands": run["device_commands_per_step"],
                   "host_calls": run["host_calls_per_step"]}
            for mode, run in (("eager", eager), ("traced", traced))
        }
    return info

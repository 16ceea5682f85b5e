"""Which device the TT implementation talks to: a chip, or the emulated device."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from .detect import OVERRIDE_VARIABLE, chip_count
from .device import DEFAULT_DRAM_SIZE
from .routing import installed, settings


def device_info() -> dict[str, Any]:
    """{"device": "chip" | "emulated", ...}: what `ttmirror info --backend tt` reports."""
    chips = chip_count()
    info: dict[str, Any] = {
        "device": "chip" if chips > 0 else "emulated",
        "chips": chips,
        "ttnn": importlib.metadata.version("ttnn"),
        "routing_installed": installed(),
        "override_variable": OVERRIDE_VARIABLE,
    }
    if chips == 0:
        info["emulated"] = {
            "max_command_queues": 2,
            "dram_bytes": settings.dram_size if installed() else DEFAULT_DRAM_SIZE,
            "scheduler": getattr(settings.scheduler, "__name__", type(settings.scheduler).__name__),
            "hazard_mode": settings.hazard_mode,
        }
    return info

"""Which device the TT implementation talks to: a chip, or the emulated device."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from .detect import OVERRIDE_VARIABLE, chip_count
from .entry import Emulator
from .routing import active, open_devices


def device_info() -> dict[str, Any]:
    """{"device": "chip" | "emulated", ...}: what `ttmirror info --backend tt` reports."""
    chips = chip_count()
    info: dict[str, Any] = {
        "device": "chip" if chips > 0 else "emulated",
        "chips": chips,
        "ttnn": importlib.metadata.version("ttnn"),
        "routing_active": active(),
        "emulated_devices_open": len(open_devices()),
        "override_variable": OVERRIDE_VARIABLE,
    }
    if chips == 0:
        defaults = Emulator()
        info["emulated"] = {
            "entry_point": "ttmirror.impl.device.open_device",
            "max_command_queues": 2,
            "dram_bytes": defaults.dram_size,
            "scheduler": getattr(defaults.scheduler, "__name__", "?"),
            "hazard_mode": defaults.hazard_mode,
        }
    return info

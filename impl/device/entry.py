"""The entry point: `open_device()` returns a chip's mesh device, or else an emulated one.

This is the one place where the emulated device comes into being. With a chip present (and
`TTMIRROR_DEVICE` not set to `emulated`), `open_device` is `ttnn.open_mesh_device` and nothing
of ttnn is touched. Without one, it builds an `EmulatedMeshDevice` and attaches it to the routing
(`routing.py`): from then until the last emulated device closes (`ttnn.close_mesh_device`, or
`device.close()`), ttnn's device-side calls on emulated objects reach it, and afterwards ttnn is
exactly as it was. `ttnn.open_mesh_device` itself is never replaced: no other call yields an
emulated device.

    device = open_device(num_command_queues=2, trace_region_size=1 << 20)
    ...  # the TT code, unchanged, against `ttnn`
    ttnn.close_mesh_device(device)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ttnn

from . import routing
from .detect import chip_present
from .device import DEFAULT_DRAM_SIZE, EmulatedMeshDevice
from .hazards import HazardMode
from .schedulers import ManualScheduler, Scheduler


@dataclass(frozen=True)
class Emulator:
    """How an emulated device is built; ignored when a chip is opened."""

    scheduler: Callable[[], Scheduler] = ManualScheduler
    """Builds the device's scheduler: who completes queued commands, and when."""
    hazard_mode: HazardMode = "raise"
    """"raise": a hazard raises at the call that makes it; "count": it is only logged."""
    dram_size: int = DEFAULT_DRAM_SIZE


def open_device(
    *,
    num_command_queues: int = 2,
    trace_region_size: int = 0,
    l1_small_size: int = 0,
    emulator: Emulator | None = None,
    emulated: bool | None = None,
) -> Any:
    """A 1x1 mesh device: the chip's when one is present, else an emulated one with ttnn routed
    to it until it closes. `emulated=True` forces the emulated device (tests beside a chip)."""
    if emulated is None:
        emulated = not chip_present()
    if not emulated:
        return ttnn.open_mesh_device(
            ttnn.MeshShape(1, 1),
            num_command_queues=num_command_queues,
            trace_region_size=trace_region_size,
            l1_small_size=l1_small_size,
        )
    options = emulator or Emulator()
    device = EmulatedMeshDevice(
        num_command_queues=num_command_queues,
        trace_region_size=trace_region_size,
        l1_small_size=l1_small_size,
        dram_size=options.dram_size,
        scheduler=options.scheduler(),
        hazard_mode=options.hazard_mode,
    )
    routing.attach(device)
    return device


def bind_sampling_identity(device: Any, request_ids: Any, positions: Any) -> None:
    """Tell an emulated device which request and position each sampling row holds (device
    tensors it reads when `ttnn.sampling` runs). On a chip this is a no-op."""
    if isinstance(device, EmulatedMeshDevice):
        device.bind_sampling_identity(request_ids, positions)

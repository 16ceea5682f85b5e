"""The entry point: the emulated device as a device provider of the mirror's seam
(`ttmirror.impl.devices`), and `open_device()` for code that wants one by hand.

This is the one place where an emulated device comes into being. `Emulator` is the provider:
the package declares `device_process` (an `Emulator` whose queues run in a device process of
their own) in the entry point group ``ttmirror.devices`` (pyproject.toml), so the mirror gets
it wherever no chip is present, without importing this package.
`Emulator(...).open(...)` builds an `EmulatedMeshDevice` with its ttnn API object
(`api.EmulatedTtnn`), which the provider hands to the mirror (`Emulator.ttnn(device)`), as a
chip's provider hands the `ttnn` module. Nothing in `ttnn` is replaced.

    device = open_device(num_command_queues=2, trace_region_size=1 << 20)
    tt = ttnn_for(device)  # ttmirror.impl.devices: the `ttnn` module on a chip
    ...  # the TT code, unchanged, against `tt`
    tt.close_mesh_device(device)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..impl.devices import CHIP, chip_present
from .api import EmulatedTtnn
from .device import DEFAULT_DRAM_SIZE, OPEN, EmulatedMeshDevice, Scheduler
from .hazards import HazardMode
from .process import ProcessScheduler
from .schedulers import ManualScheduler


@dataclass(frozen=True)
class Emulator:
    """How an emulated device is built: a `DeviceProvider` of kind "emulated"."""

    scheduler: Callable[[], Scheduler] = ManualScheduler
    """Builds the device's scheduler: who completes queued commands, and when."""
    hazard_mode: HazardMode = "raise"
    """"raise": a hazard raises at the call that makes it; "count": it is only logged."""
    dram_size: int = DEFAULT_DRAM_SIZE
    planted: frozenset[str] = frozenset()
    """Bugs planted in the device's allocator (`allocator.PLANTED`); none by default."""
    process: bool = False
    """Run the device's queues in a device process of their own (`ProcessScheduler`), the
    completion order still `scheduler`'s (a `ManualScheduler` or a subclass)."""

    kind = "emulated"

    def open(self, *, num_command_queues: int = 2, trace_region_size: int = 0,
             l1_small_size: int = 0) -> EmulatedMeshDevice:
        """A new emulated 1x1 mesh device, with its ttnn API object."""
        device = EmulatedMeshDevice(
            num_command_queues=num_command_queues,
            trace_region_size=trace_region_size,
            l1_small_size=l1_small_size,
            dram_size=self.dram_size,
            scheduler=self._scheduler(),
            hazard_mode=self.hazard_mode,
            planted=self.planted,
        )
        device.api = EmulatedTtnn(device)
        return device

    def ttnn(self, device: Any) -> EmulatedTtnn:
        """The ttnn API `device` is driven through: its own `EmulatedTtnn`."""
        assert isinstance(device, EmulatedMeshDevice) and device.api is not None
        return device.api

    def _scheduler(self) -> Scheduler:
        scheduler = self.scheduler()
        if not self.process or isinstance(scheduler, ProcessScheduler):
            return scheduler
        return ProcessScheduler(policy=scheduler)  # which refuses a policy that is not manual

    def owns(self, device: Any) -> bool:
        return isinstance(device, EmulatedMeshDevice)

    def bind_sampling_identity(self, device: Any, request_ids: Any, positions: Any) -> None:
        device.bind_sampling_identity(request_ids, positions)

    def info(self) -> dict[str, Any]:
        return {
            "emulated_devices_open": len(open_devices()),
            "emulated": {
                "entry_point": "ttmirror.emulator.open_device",
                "max_command_queues": 2,
                "dram_bytes": self.dram_size,
                "scheduler": getattr(self.scheduler, "__name__", "?"),
                "device_process": self.process or self.scheduler is ProcessScheduler,
                "hazard_mode": self.hazard_mode,
            },
        }


def device_process() -> Emulator:
    """The provider the entry point declares, and `open_device`'s default: an emulated device
    whose queues run in a device process of their own (`ProcessScheduler`), each command as
    soon as it is ready, beside the host, as a chip's cores run it. Harnesses that choose the
    completion order build their own `Emulator`."""
    return Emulator(scheduler=ProcessScheduler)


def open_device(
    *,
    num_command_queues: int = 2,
    trace_region_size: int = 0,
    l1_small_size: int = 0,
    emulator: Emulator | None = None,
    emulated: bool | None = None,
) -> Any:
    """A 1x1 mesh device: the chip's when one is present, else an emulated one built as
    `emulator` (default: `device_process()`). `emulated=True` forces the emulated device
    (tests beside a chip)."""
    if emulated is None:
        emulated = not chip_present()
    provider = (emulator or device_process()) if emulated else CHIP
    return provider.open(num_command_queues=num_command_queues,
                         trace_region_size=trace_region_size, l1_small_size=l1_small_size)


def open_devices() -> list[EmulatedMeshDevice]:
    """The emulated devices open now, copies included (a diagnostic: see `device.OPEN`)."""
    return list(OPEN)

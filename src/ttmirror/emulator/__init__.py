"""An emulated Tenstorrent device behind the real ttnn API: the mirror's only stand-in for
silicon here. Nothing in `ttmirror.impl` or `ttmirror.serving` imports this package; it plugs
into the mirror's device seam (`ttmirror.impl.devices`) through the entry point group
``ttmirror.devices``, and its serving decoder op (`decoder.py`) into the serving engine's through
``ttmirror.serving.decoders`` (both declared in pyproject.toml).

`Emulator` (`entry.py`) is the provider, `open_device()` the way to a device by hand: on a machine
with a chip it opens the chip; without one it builds an `EmulatedMeshDevice` with its own ttnn API
object (`api.py`: ttnn's functions, each call bound against the real signature and routed to the
emulated device when it names an emulated object). The emulated device has in-order command queues
that complete only when advanced, events that order them, trace capture and replay at fixed
addresses, a first-fit DRAM allocator that reuses freed addresses, and hazard reports.

    from ttmirror.emulator import Emulator, SeededScheduler, open_device
    dev = open_device(num_command_queues=2, trace_region_size=1 << 20,
                      emulator=Emulator(scheduler=lambda: SeededScheduler(seed=1)))
    tt = dev.api                       # what `ttnn_for(dev)` hands the mirror
    ...  # the TT code, unchanged, against `tt`
    dev.ready_commands(); dev.step(0)  # emulated only: complete CQ0's next command by hand
    dev.hazards.counts                 # hazards by kind; HazardError raised in "raise" mode
    tt.close_mesh_device(dev)

Nothing here changes `ttnn`, before, while or after an emulated device is open.
`ttmirror.impl.devices.device_info()` says which device a backend would use: {"device": "chip" |
"emulated", ...}.
"""

from .api import EmulatedTtnn
from .commands import Command, MeshEvent, MeshTraceId
from .device import EmulatedMeshDevice
from .entry import Emulator, open_device, open_devices
from .hazards import Hazard, HazardError, HazardKind, HazardLog
from .process import ProcessScheduler
from .schedulers import ManualScheduler, SeededScheduler, TimedScheduler
from .tensors import DeviceTensor, HostReadback
from .threads import ThreadedScheduler

__all__ = [
    "Command",
    "DeviceTensor",
    "EmulatedMeshDevice",
    "EmulatedTtnn",
    "Emulator",
    "Hazard",
    "HazardError",
    "HazardKind",
    "HazardLog",
    "HostReadback",
    "ManualScheduler",
    "MeshEvent",
    "MeshTraceId",
    "ProcessScheduler",
    "SeededScheduler",
    "ThreadedScheduler",
    "TimedScheduler",
    "open_device",
    "open_devices",
]

"""An emulated Tenstorrent device behind the real ttnn API.

With no chip present, `routing.install()` (or `with routing.emulation():`) routes ttnn's
device-side calls to `EmulatedMeshDevice`: in-order command queues that complete only when
advanced, events that order them, trace capture and replay at fixed addresses, a first-fit DRAM
allocator that reuses freed addresses, and hazard reports (`HazardError`, `device.hazards`).
On a chip, `install()` does nothing and ttnn runs for real.
"""

from .commands import Command, MeshEvent, MeshTraceId
from .device import EmulatedMeshDevice
from .hazards import Hazard, HazardError, HazardKind, HazardLog
from .info import device_info
from .routing import bind_sampling_identity, emulation, install, uninstall
from .sampling import sampling_uniform, seeded_sample
from .schedulers import ManualScheduler, SeededScheduler, ThreadedScheduler
from .tensors import DeviceTensor, HostReadback

__all__ = [
    "Command",
    "DeviceTensor",
    "EmulatedMeshDevice",
    "Hazard",
    "HazardError",
    "HazardKind",
    "HazardLog",
    "HostReadback",
    "ManualScheduler",
    "MeshEvent",
    "MeshTraceId",
    "SeededScheduler",
    "ThreadedScheduler",
    "bind_sampling_identity",
    "device_info",
    "emulation",
    "install",
    "sampling_uniform",
    "seeded_sample",
    "uninstall",
]

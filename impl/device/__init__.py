"""An emulated Tenstorrent device behind the real ttnn API.

With no chip present, `install()` (or `with emulation():`) routes ttnn's device-side calls to
`EmulatedMeshDevice`: in-order command queues that complete only when advanced, events that order
them, trace capture and replay at fixed addresses, a first-fit DRAM allocator that reuses freed
addresses, and hazard reports. On a chip, `install()` does nothing and ttnn runs for real.

    from ttmirror.impl.device import install, SeededScheduler
    install(scheduler=lambda: SeededScheduler(seed=1))  # default: ManualScheduler
    dev = ttnn.open_mesh_device(ttnn.MeshShape(1, 1), num_command_queues=2, trace_region_size=...)
    ...  # the TT code, unchanged, against `ttnn`
    dev.ready_commands(); dev.step(0)  # advance by hand: complete CQ0's next command
    dev.hazards.counts                 # hazards by kind; HazardError raised in "raise" mode

`device_info()` says which device is in use: {"device": "chip" | "emulated", ...}.
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

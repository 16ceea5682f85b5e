"""The device combine: step N+1's input ids from host ids and step N's slot, built on device.

    gathered  = gather(slot[N mod K], dim=1, index=prev_map)       # row i <- slot[prev_map[i]]
    input_ids = where(use_mirror, gathered, host_ids)              # mirror rows vs host rows

Host ids, the previous-row map, the use-mirror mask and the positions are persistent device
tensors, allocated at load and refilled per step with `copy_host_to_device_tensor` (never
reallocated, so a captured trace keeps reading them). Rows move freely between steps (condense,
reorder, arrivals, finishes, aborts, preemption): the map says where each row's newest token sits
in the previous slot, and the host never needs to know its value.
"""

from __future__ import annotations

from typing import Any

import ttnn

from . import faults
from .backend import StepInputs
from .ring import allocate_ids, host_uint32


class DeviceCombine:
    """Persistent step inputs and the two combine ops writing the persistent input ids."""

    def __init__(self, device: Any, width: int, cq: int = 0) -> None:
        self.width = width
        self.cq = cq
        self.host_ids = allocate_ids(device, width)
        self.prev_map = allocate_ids(device, width)
        self.use_mirror = allocate_ids(device, width)
        self.positions = allocate_ids(device, width)
        self.gathered = allocate_ids(device, width)
        self.input_ids = allocate_ids(device, width)
        """What the forward consumes: the combine's output."""

    def stage(self, inputs: StepInputs) -> None:
        """Host writes of the step's inputs, in queue order after the previous step's reads."""
        cq = 1 if faults.active("stage-cq1-no-event") else self.cq  # planted: no handshake
        for values, target in (
            (inputs.host_ids, self.host_ids),
            (inputs.prev_map, self.prev_map),
            (inputs.use_mirror, self.use_mirror),
            (inputs.positions, self.positions),
        ):
            ttnn.copy_host_to_device_tensor(host_uint32(values, self.width), target, cq_id=cq)

    def enqueue(self, source: ttnn.Tensor) -> None:
        """The device half of the combine, reading `source` (the previous step's slot).

        Rows that take host ids still gather (index 0, discarded by `where`): one op sequence
        for every batch layout, so one captured trace serves them all.
        """
        with ttnn.command_queue(self.cq):
            ttnn.gather(source, 1, self.prev_map, out=self.gathered)
            ttnn.where(self.use_mirror, self.gathered, self.host_ids, output_tensor=self.input_ids)

"""Decode-step traces: the step (combine, forward, sample into the slot) captured and replayed.

A replay runs the recorded commands at their captured addresses, so the step that writes slot k
and reads slot k-1 is one trace; the ring has K slots, so there are K traces, one per control
path, each captured once at load and replayed for every later step that writes its slot. Every
tensor they touch is allocated before capture and outlives them (`Ring.seal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .devices import ttnn_for


class DecodeTraces:
    def __init__(self, device: Any, slots: int, cq: int = 0) -> None:
        self.tt = ttnn_for(device)
        self.device = device
        self.cq = cq
        self.slots = slots
        self.ids: list[Any] = []
        self.captures = 0
        self.replays = 0

    def capture(self, step: Callable[[int], None]) -> None:
        """Compile once, then record `step(slot)` for every slot. Host I/O is forbidden inside."""
        if self.ids:
            raise RuntimeError("decode traces are already captured; release them first")
        step(0)  # every op must be in the program cache before capture
        for slot in range(self.slots):
            trace_id = self.tt.begin_trace_capture(self.device, cq_id=self.cq)
            step(slot)
            self.tt.end_trace_capture(self.device, trace_id, cq_id=self.cq)
            self.ids.append(trace_id)
            self.captures += 1

    def replay(self, slot: int) -> None:
        self.tt.execute_trace(self.device, self.ids[slot], cq_id=self.cq, blocking=False)
        self.replays += 1

    def release(self) -> None:
        for trace_id in self.ids:
            self.tt.release_trace(self.device, trace_id)
        self.ids = []

"""Captured traces: commands recorded with their buffer addresses, replayed at those addresses."""

from __future__ import annotations

from dataclasses import dataclass, field

from .allocator import Buffer
from .commands import Program


@dataclass(eq=False)
class Trace:
    id: int
    cq: int
    first_serial: int  # allocations with this serial or later were made during or after capture
    programs: list[Program] = field(default_factory=list)
    captured: bool = False  # end_trace_capture was called
    released: bool = False
    end_serial: int = 0  # allocations with this serial or later were made after the capture
    size: int = 0  # bytes of the trace region it occupies
    warned: set[int] = field(default_factory=set)  # buffers already reported at a replay

    @property
    def alive(self) -> bool:
        return not self.released

    @property
    def buffers(self) -> set[Buffer]:
        return {b for program in self.programs for b in (*program.reads, *program.writes)}

    def label(self) -> str:
        return f"trace {self.id} (CQ{self.cq})"

"""What a lockstep run is made of, and how it fails: moves and divergences (no implementation
imported, so a trace file can be read without the runner).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.actions import Action

EFFECT = "device_effect"
"""A device move that completes commands through the next one a model effect stands for."""


@dataclass(frozen=True)
class Move:
    """One step of a run: ``kind`` is act, device or refuse; ``action`` what was done."""

    kind: str
    action: Action

    def label(self) -> str:
        if self.kind == "device" and self.action.name == EFFECT:
            return f"device(cq={self.action.args[0]}, through the next effect)"
        if self.kind == "device":
            return f"device(cq={self.action.args[0]})"
        if self.kind == "refuse":
            return f"refuse {self.action.label()}"
        return self.action.label()


class Divergence(AssertionError):
    """The implementation and the model disagree (or a model invariant broke)."""

    def __init__(self, kind: str, message: str, step: int) -> None:
        super().__init__(f"step {step}: {kind}: {message}")
        self.kind = kind
        self.message = message
        self.step = step

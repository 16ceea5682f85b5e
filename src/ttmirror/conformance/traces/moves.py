"""What a lockstep run is made of, and how it fails: moves and divergences (no implementation
imported, so a trace file can be read without the runner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ttmirror.model.actions import Action

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


class Drafter(NamedTuple):
    """The probe drafter of a run with drafts: the implementation's `DraftSpec` less K (the
    bounds' spec tokens). Which rows of its table agree with the target decides which drafts
    verification accepts, so it is part of what a run is, as its prompts are."""

    seed: int = 1
    """The seeded share's seed (where `agree` is None)."""
    agreement: float = 0.6
    """The seeded share of agreeing rows (where `agree` is None)."""
    agree: tuple[int, ...] | None = None
    """The agreeing rows themselves, or None: the seeded share."""

    def as_json(self) -> dict[str, object]:
        return {"seed": self.seed, "agreement": self.agreement,
                "agree": None if self.agree is None else list(self.agree)}

    @staticmethod
    def from_json(data: object) -> Drafter:
        """The drafter a trace's metadata names (ValueError: not one)."""
        if not isinstance(data, dict) or set(data) != {"seed", "agreement", "agree"}:
            raise ValueError(f"not a drafter: {data!r}")
        agree = data["agree"]
        if agree is not None and not (isinstance(agree, list)
                                      and all(type(x) is int for x in agree)):
            raise ValueError(f"a drafter's agreeing rows are integers, not {agree!r}")
        return Drafter(int(data["seed"]), float(data["agreement"]),
                       None if agree is None else tuple(sorted(agree)))

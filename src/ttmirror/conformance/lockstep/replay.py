"""Replay a list of moves against model and implementation, and shrink failing ones.

A replay is deterministic: the device advances only on ``device`` moves (and on the host's own
blocking calls), and every other choice is in the moves. `replay` says whether the moves conform,
reproduce a failure, or are not a behaviour of the model at all (an act the model disables, a
refusal of an action it enables, a device move with nothing ready, or a model state that differs
from the one the trace claims).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ttmirror.conformance.lockstep.harness import Lockstep, detached, permissive
from ttmirror.conformance.traces.itf import encode_state
from ttmirror.conformance.traces.moves import EFFECT, Divergence, Drafter, Move
from ttmirror.model.actions import take
from ttmirror.model.state import Bounds

CONFORMS, FAILS, INVALID = "conforms", "fails", "invalid"


@dataclass
class ReplayedMove:
    """One move of a replay: its number, its label, and how it went."""

    index: int
    label: str
    outcome: str
    """ok, or what diverged."""


@dataclass
class Outcome:
    status: str
    replayed: list[ReplayedMove]
    divergence: Divergence | None = None
    reason: str | None = None
    """Why the moves are invalid for this model."""


def replay(
    bounds: Bounds,
    backend: str,
    prompts: Sequence[int],
    moves: Sequence[Move],
    claimed: Sequence[dict[str, Any]] | None = None,
    config: str | None = None,
    sampling: str = "greedy",
    sampling_seed: int = 0,
    bug: str | None = None,
    drafter: Drafter | None = None,
    device_process: bool = False,
) -> Outcome:
    """Run `moves` in lockstep, `bug` planted in the implementation; `claimed[i]` is the trace's
    encoded model state after move i; `drafter`: with spec tokens, the run's; `device_process`:
    the emulated device's queues in a device process of their own (`Emulator.process`)."""
    ls = Lockstep(bounds, backend, prompts, config=config, sampling=sampling,
                  sampling_seed=sampling_seed, bug=bug, drafter=drafter,
                  device_process=device_process)
    replayed: list[ReplayedMove] = []
    try:
        for i, move in enumerate(moves):
            reason = _invalid(ls, move)
            if reason is not None:
                return Outcome(INVALID, replayed, reason=f"move {i + 1} ({move.label()}): {reason}")
            try:
                ls.perform(move)
            except Divergence as d:
                diverged = f"DIVERGES: {d.kind}: {d.message}"
                replayed.append(ReplayedMove(i + 1, move.label(), diverged))
                return Outcome(FAILS, replayed, divergence=d)
            if claimed is not None:
                mine = {k: v for k, v in encode_state(ls.state).items()}
                theirs = {k: claimed[i].get(k) for k in mine}
                if mine != theirs:
                    return Outcome(INVALID, replayed, reason=f"move {i + 1} ({move.label()}): the "
                                   "trace's model state is not this model's")
            replayed.append(ReplayedMove(i + 1, move.label(), "ok"))
    finally:
        try:
            ls.close()
        finally:
            # The divergence is kept as the outcome's report; its frames (this run, its device and
            # host tensors) go, once the device is closed: a pending readback they hold is dropped
            # only then, not reported as dropped before the host synchronised with it.
            if ls.failure is not None:
                detached(ls.failure)
    return Outcome(CONFORMS, replayed)


def _invalid(ls: Lockstep, move: Move) -> str | None:
    if move.kind == "act":
        if move.action.name not in ("allocate", "arrive", "schedule", "combine", "launch",
                                    "readback_issue", "readback_complete", "apply", "release",
                                    "finish", "abort", "preempt", "resume"):
            return f"unknown action {move.action.name!r}"
        try:
            enabled = take(ls.state, ls.bounds, move.action) is not None
        except (IndexError, TypeError):
            return "its arguments do not fit the action"
        if not enabled:
            return "the model disables it"
        if move.action.name == "launch" and ls.bounds.spec_tokens:
            accepts = ls.predicted(move.action.args[0])
            if move.action.args[1:] != accepts:
                return f"the run's drafter makes the verification accept {accepts}"
    elif move.kind == "device":
        if move.action.args[0] not in (0, 1):
            return "no such command queue"
        if not ls.device_ready(move.action.args[0]):
            return "no command is ready on that queue (or the device is not emulated)"
        if move.action.name == EFFECT and not ls.effect_ready(move.action.args[0]):
            return "no command of a model effect can be reached on that queue"
    elif move.kind == "refuse":
        try:
            enabled = take(ls.state, permissive(ls.bounds), move.action) is not None
        except (KeyError, IndexError, TypeError):
            return "not an action of this model"
        if enabled:
            return "the model enables it, so the implementation need not refuse it"
    else:
        return f"unknown move kind {move.kind!r}"
    return None


def shrink(
    moves: list[Move], fails: Callable[[list[Move]], bool], *, budget: int = 400
) -> list[Move]:
    """Greedy one-move deletion to a fixpoint (at most `budget` replays): still failing, shorter.

    Deleting a move can make a later one invalid for the model; such candidates simply do not
    fail (`replay` calls them invalid), so every result is a real behaviour of the model.
    """
    best, tries, changed = list(moves), 0, True
    while changed and tries < budget:
        changed = False
        i = len(best) - 1
        while i >= 0 and tries < budget:
            candidate = best[:i] + best[i + 1:]
            tries += 1
            if fails(candidate):
                best, changed = candidate, True
            i -= 1
    return best

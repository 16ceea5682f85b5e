"""The allocator half of the kill matrix: the emulated device's own planted bugs.

The saved-state walks (`branches.py`) rely on a restored run never sharing device memory with
another live run. The scenario here is theirs in miniature: a runner steps once, is saved,
restored (the copy discarded at once, so its memory is what the allocator hands out next), and
restored twice more; the two copies and the original then step together. The device's overlap
check (`emulator/allocator.py`) must report a buffer handed out while another live one holds
its memory; with nothing planted, the three runs deliver the same tokens and meet no hazard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ttmirror.conformance.rig import open_rig
from ttmirror.emulator import (
    EmulatedMeshDevice,
    HazardError,
)
from ttmirror.emulator import allocator as allocator_module
from ttmirror.emulator.snapshot import restore, snapshot
from ttmirror.impl.devices import ttnn_for
from ttmirror.impl.runner import Runner, RunnerConfig
from ttmirror.impl.tt_backend import TtBackend

STEPS = 3
"""Steps the three runs take together after the restores."""


def step(runner: Runner) -> None:
    """One whole step: schedule to apply, then hand back every slot the runner allows."""
    q = runner.schedule()
    runner.combine(q)
    runner.launch(q)
    runner.readback_issue(q)
    runner.readback_complete(q)
    runner.apply()
    for slot in range(len(runner.slots)):
        if runner.releasable(slot):
            runner.release(slot)


def device_of(runner: Runner) -> EmulatedMeshDevice:
    device = runner.backend.device  # type: ignore[attr-defined]
    assert isinstance(device, EmulatedMeshDevice)
    return device


def delivered(runner: Runner) -> list[list[int]]:
    return [list(runner.requests[r].delivered) for r in sorted(runner.requests)]


@dataclass
class Verdict:
    """The scenario's run: which check failed first (None: every check held)."""

    layer: str | None
    message: str | None
    seconds: float
    tokens: list[list[int]] | None = None
    """What the original run delivered, per request, when all three runs ended."""


def check(planted: frozenset[str] = frozenset()) -> Verdict:
    """Run the scenario on a device whose allocator carries `planted`; check it on data."""
    started = time.perf_counter()

    def verdict(layer: str | None, message: str | None) -> Verdict:
        return Verdict(layer, message, round(time.perf_counter() - started, 3),
                       delivered(runner) if runner.requests else None)

    spare = allocator_module._SPARE
    allocator_module._SPARE = []  # a spare list of its own: a planted run leaves shared DRAM
    device = open_rig("tiny", planted=planted)
    runner = Runner(TtBackend(device, readback_cq=1),
                    RunnerConfig(depth=2, slots=2, rows=2, max_tokens=6))
    copies: list[Any] = []
    try:
        runner.allocate()
        runner.arrive(0, 5, max_tokens=6)
        runner.arrive(1, 9, max_tokens=6)
        step(runner)
        saved = snapshot(runner)
        device_of(restore(saved)).discard()  # its DRAM is the spare the next restore takes
        copies += [restore(saved), restore(saved)]
        for _ in range(STEPS):
            for run in (runner, *copies):
                step(run)
        if not delivered(copies[0]) == delivered(copies[1]) == delivered(runner):
            return verdict("device data", "the restored copies delivered other tokens")
        hazards = sum(device_of(run).hazards.total for run in (runner, *copies))
        if hazards:
            return verdict("hazard", f"{hazards} hazards counted")
        return verdict(None, None)
    except HazardError as e:
        return verdict("hazard", str(e).splitlines()[0][:300])
    finally:
        for copy in copies:
            device_of(copy).discard()
        ttnn_for(device).close_mesh_device(device)
        allocator_module._SPARE = spare


def kill(bug: str) -> tuple[bool, Verdict]:
    """Run the scenario with `bug` planted in the allocator: (killed, what found it)."""
    v = check(frozenset({bug}))
    return v.layer is not None, v

"""The device work of one steady decode step, as the mirror issues it: ops and commands.

`step_calls()` runs the tt mirror (the probe model) on an emulated device for three steps of
two requests at depth 2, and reports the third: a step whose rows read their newest token from
the previous step's slot. It lists each ttnn op the step issues with, per tensor argument, its
dtype, layout and shape and the documented rule it satisfies (`support.py`, via `checker.py`),
and counts the device commands the step costs, eagerly and with the decode step captured as a
trace. The calls are the same on a chip; only the emulated device can count them here. With
`spec_tokens` K > 0 the mirror carries K drafts (spec rule 13), and the measured step is one
whose rows read newest token, position and drafts from the previous slot and verify.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..impl.drafts import DraftSpec
from ..impl.runner import Runner, RunnerConfig
from ..impl.tt_backend import TtBackend
from . import checker
from .entry import Emulator, open_device

STEPS = 3
"""Steps run; the last one is measured (step 1 prefills, step 2 already reads the mirror)."""


def step_calls(*, trace: bool = False, spec_tokens: int = 0) -> dict[str, Any]:
    """{"ops": [...], "commands": {...}, "trace": bool} for one steady step (with
    `spec_tokens` drafts per decoding row, when more than 0)."""
    device = open_device(
        num_command_queues=2, trace_region_size=1 << 20, emulator=Emulator(), emulated=True
    )
    runner: Runner | None = None
    try:
        drafts = DraftSpec(k=spec_tokens) if spec_tokens else None
        runner = Runner(TtBackend(device), RunnerConfig(depth=2, slots=2, rows=2, trace=trace,
                                                        drafts=drafts))
        runner.allocate()
        for req, prompt in enumerate((3, 5)):
            runner.arrive(req, prompt, max_tokens=8)
        for _ in range(STEPS - 1):
            _one_step(runner)
        tt = device.api
        tt.synchronize_device(device)
        before, host_before = len(device.completion_log), Counter(tt.host_calls)
        with checker.recording(device) as calls:
            _one_step(runner)
        tt.synchronize_device(device)
        names = [c.split("#")[0] for c in device.completion_log[before:]]
        host = tt.host_calls - host_before
        host["synchronize_device"] -= 1  # ours, above: not the step's
        del host["command_queue"]  # a context, not a call to the device
        host["Tensor.cpu"] = names.count("cpu")  # a method of the device tensor
        return {
            "trace": trace,
            "spec_tokens": spec_tokens,
            "ops": [_describe(call) for call in calls],
            "device_commands": dict(Counter(names)),
            "device_commands_per_step": len(names),
            "host_calls": dict(+host),
            "host_calls_per_step": sum((+host).values()),
            "hazards": device.hazards.total,
        }
    finally:
        if runner is not None:
            runner.close()
        device.api.close_mesh_device(device)


def _one_step(runner: Runner) -> None:
    """Schedule, combine, launch and read back one step, then retire the oldest if two fly."""
    q = runner.schedule()
    runner.combine(q)
    runner.launch(q)
    runner.readback_issue(q)
    if len(runner.queue) == runner.depth:
        runner.readback_complete(0)
        slot = runner.queue[0].slot
        runner.apply()
        if runner.releasable(slot):
            runner.release(slot)


def _describe(call: checker.Satisfied) -> dict[str, Any]:
    return {"op": f"ttnn.{call.op}", "documented": call.documented, "args": call.args}

"""Phase sequences the runner tests share."""

from __future__ import annotations

from ttmirror.impl.runner import Runner


def retire_oldest(runner: Runner) -> None:
    """Read the oldest step back, apply it, and hand its slot back where nothing reads it."""
    runner.readback_issue(0)
    runner.readback_complete(0)
    slot = runner.queue[0].slot
    runner.apply()
    if runner.releasable(slot):
        runner.release(slot)

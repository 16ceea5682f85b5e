"""The TimedScheduler: per-command device times decide which queue finishes first, on a seeded
clock, so the same seed and calls give the same completion order."""

from __future__ import annotations

import pytest
import ttnn

from ttmirror.emulator import TimedScheduler

from .conftest import host_ids, on_device, open_emulated


def _order(costs: dict[str, float], seed: int = 0, jitter: float = 0.1) -> list[str]:
    """Completion order of a slow-or-fast op on CQ0 beside a write on CQ1, enqueued after it."""
    dev = open_emulated(scheduler=lambda: TimedScheduler(costs, seed, jitter=jitter))
    try:
        a = on_device(dev, [1, 2])
        b = on_device(dev, [3, 4])
        ttnn.synchronize_device(dev)
        start = len(dev.completion_log)
        ttnn.plus_one(a)
        ttnn.copy_host_to_device_tensor(host_ids([7, 8]), b, cq_id=1)
        ttnn.synchronize_device(dev)
        return [label.split("#")[0] for label in dev.completion_log[start:]]
    finally:
        ttnn.close_mesh_device(dev)


def test_the_command_times_decide_which_queue_finishes_first() -> None:
    slow_op = _order({"plus_one": 10.0, "copy_host_to_device_tensor": 0.1})
    slow_copy = _order({"plus_one": 0.1, "copy_host_to_device_tensor": 10.0})
    assert slow_op == ["copy_host_to_device_tensor", "plus_one"]
    assert slow_copy == ["plus_one", "copy_host_to_device_tensor"]


def test_the_same_seed_gives_the_same_order_and_seeds_differ() -> None:
    # Equal times, one host call apart (1.0), jittered by up to half of 4.0: the seed decides.
    costs = {"plus_one": 4.0, "copy_host_to_device_tensor": 4.0}
    orders = {tuple(_order(costs, seed, jitter=0.5)) for seed in range(12)}
    assert _order(costs, 3, jitter=0.5) == _order(costs, 3, jitter=0.5)
    assert len(orders) == 2


def test_impossible_times_are_refused() -> None:
    with pytest.raises(ValueError, match="host_s > 0"):
        TimedScheduler(host_s=0)
    with pytest.raises(ValueError, match="0 or more"):
        TimedScheduler({"plus_one": -1.0})

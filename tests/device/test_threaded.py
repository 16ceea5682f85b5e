"""Threaded mode: real worker threads per CQ, for soak runs."""

from __future__ import annotations

import ttnn

from ttmirror.impl.device import ThreadedScheduler

from .conftest import open_emulated
from .test_handshake import run_handshake


def test_handshake_soak_on_worker_threads() -> None:
    device = open_emulated(scheduler=ThreadedScheduler, hazard_mode="count")
    seen = run_handshake(device, 200)
    assert seen == [1] * 200
    assert device.hazards.total == 0
    assert len(device.completion_log) > 200 * 8
    ttnn.close_mesh_device(device)


def test_missing_wait_is_counted_on_worker_threads() -> None:
    device = open_emulated(scheduler=ThreadedScheduler, hazard_mode="count")
    run_handshake(device, 50, skip="write_event")
    assert device.hazards.counts["read-after-write"] > 0
    ttnn.close_mesh_device(device)

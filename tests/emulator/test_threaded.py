"""Threaded mode: real worker threads per CQ, for soak runs."""

from __future__ import annotations

import torch
import ttnn

from ttmirror.emulator import ThreadedScheduler

from .conftest import open_emulated
from .test_handshake import run_handshake


def test_handshake_soak_on_worker_threads() -> None:
    device = open_emulated(scheduler=ThreadedScheduler, hazard_mode="count")
    tt = device.api
    seen = run_handshake(device, 200)
    assert seen == [1] * 200
    assert device.hazards.total == 0
    assert len(device.completion_log) > 200 * 8
    tt.close_mesh_device(device)


def test_missing_wait_is_counted_on_worker_threads() -> None:
    device = open_emulated(scheduler=ThreadedScheduler, hazard_mode="count")
    tt = device.api
    run_handshake(device, 50, skip="write_event")
    assert device.hazards.counts["read-after-write"] > 0
    tt.close_mesh_device(device)


def test_a_queue_is_busy_for_its_configured_time_and_the_workers_report_their_cpu() -> None:
    # plus_one holds CQ0 for 20 ms each time: 10 of them keep the queue busy 0.2 s or more,
    # and a host blocked on the last one is woken when it completes, not before.
    scheduler = ThreadedScheduler({"plus_one": 0.02})
    device = open_emulated(scheduler=lambda: scheduler)
    tt = device.api
    work = tt.allocate_tensor_on_device(ttnn.Shape([1, 4]), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT,
                                          device)
    tt.copy_host_to_device_tensor(
        tt.from_torch(torch.zeros((1, 4), dtype=torch.int32), dtype=ttnn.int32), work, cq_id=0)
    for _ in range(10):
        tt.plus_one(work)
    values = tt.to_torch(work.cpu(blocking=True, cq_id=0))
    assert values.tolist() == [[10] * 4]
    assert scheduler.busy_s[0] >= 10 * 0.02
    tt.close_mesh_device(device)  # joins the workers: their CPU is final
    assert set(scheduler.cpu_s) == {0, 1} and all(t > 0 for t in scheduler.cpu_s.values())

"""Threaded mode: real worker threads per CQ, for soak runs."""

from __future__ import annotations

import ttnn

from ttmirror.impl.device import ThreadedScheduler, routing

from .test_handshake import run_handshake


def test_handshake_soak_on_worker_threads(routed: None) -> None:
    routing.install(scheduler=ThreadedScheduler, hazard_mode="count")
    device = ttnn.open_mesh_device(
        mesh_shape=ttnn.MeshShape(1, 1), num_command_queues=2, trace_region_size=1 << 20
    )
    seen = run_handshake(device, 200)
    assert seen == [1] * 200
    assert device.hazards.total == 0
    assert len(device.completion_log) > 200 * 8
    ttnn.close_mesh_device(device)


def test_missing_wait_is_counted_on_worker_threads(routed: None) -> None:
    routing.install(scheduler=ThreadedScheduler, hazard_mode="count")
    device = ttnn.open_mesh_device(
        mesh_shape=ttnn.MeshShape(1, 1), num_command_queues=2, trace_region_size=1 << 20
    )
    run_handshake(device, 50, skip="write_event")
    assert device.hazards.counts["read-after-write"] > 0
    ttnn.close_mesh_device(device)

"""Routing: ttnn changes only while an emulated device from `open_device` is open, and only for
emulated objects; importing ttmirror or building a backend leaves ttnn exactly as it was."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import ttnn

from ttmirror.emulator import EmulatedMeshDevice, ProcessScheduler, open_device, routing
from ttmirror.impl.devices import chip_count, device_info

from .conftest import open_emulated

WATCHED = ("gather", "where", "open_mesh_device", "close_mesh_device", "from_torch", "to_torch")
TENSOR_METHODS = ("to", "to_torch", "to_numpy", "to_list", "item")


def _snapshot() -> dict[str, Any]:
    names = {*WATCHED, *routing.ROUTES}
    return {
        **{f"ttnn.{n}": getattr(ttnn, n) for n in names},
        **{f"ttnn.Tensor.{m}": getattr(ttnn.Tensor, m) for m in TENSOR_METHODS},
    }


def _changed(before: dict[str, Any]) -> list[str]:
    return sorted(name for name, value in _snapshot().items() if value is not before[name])


# Run in a fresh interpreter: ttnn's attributes are read before any ttmirror module is imported.
_FRESH = r"""
import importlib, json, pkgutil, sys
import ttnn

NAMES = ("gather", "where", "open_mesh_device", "close_mesh_device", "copy_host_to_device_tensor",
         "from_device", "record_event", "execute_trace", "argmax", "command_queue")
METHODS = ("to", "to_torch", "to_numpy", "to_list", "item")

def snapshot():
    return {**{n: id(getattr(ttnn, n)) for n in NAMES},
            **{"Tensor." + m: id(getattr(ttnn.Tensor, m)) for m in METHODS}}

before = snapshot()
imported = []
def walk(package):
    root = importlib.import_module(package)
    imported.append(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)

walk("ttmirror.impl")
walk("ttmirror.serving")
chip_side_loaded = sorted(m for m in sys.modules if m.startswith("ttmirror.emulator"))
walk("ttmirror.emulator")
after_import = snapshot()

from ttmirror.impl.backend import get_backend
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.cli.info import backend_info
from ttmirror.impl.resolution import resolve
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.models import ProbeDecoder

built = [TtBackend(), get_backend("tt"), CpuBackend(), get_backend("cpu")]
built.append(ServingBackend(TtBackend(), ProbeDecoder()))
for backend in built:
    resolve(backend, "auto")
    backend.device_kind()
    backend.info()
info = backend_info("tt")
after_build = snapshot()
print(json.dumps({"imported": imported, "before": before, "chip_side": chip_side_loaded,
                  "after_import": after_import,
                  "after_build": after_build, "device": info["device"],
                  "routing_active": info["details"]["routing_active"]}))
"""


def test_importing_ttmirror_and_building_backends_leave_ttnn_untouched() -> None:
    env = {**os.environ, "LOGURU_LEVEL": "WARNING"}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, env=env, timeout=300,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The walk really imported the mirror, the emulated device and the serving engine.
    assert {"ttmirror.impl.tt_backend", "ttmirror.emulator.routing",
            "ttmirror.emulator.entry", "ttmirror.serving.batching"} <= set(seen["imported"])
    # Importing every module of the mirror and of the serving engine loads no emulator module.
    assert seen["chip_side"] == []
    assert seen["after_import"] == seen["before"]
    assert seen["after_build"] == seen["before"]
    assert seen["routing_active"] is False


def test_open_device_routes_while_open_and_restores_on_close() -> None:
    before = _snapshot()
    first = open_emulated()
    try:
        assert routing.active() and routing.open_devices() == [first]
        assert "routed" in repr(ttnn.gather) and "routed" in repr(ttnn.where)
        # ttnn.open_mesh_device is never replaced: open_device is the only way to an emulated one.
        assert ttnn.open_mesh_device is before["ttnn.open_mesh_device"]
        second = open_emulated()
        ttnn.close_mesh_device(first)
        assert routing.active() and routing.open_devices() == [second]  # second still open
        second.close()  # closing directly detaches too
    finally:
        first.close()
    assert not routing.active() and routing.open_devices() == []
    assert _changed(before) == []


def test_routing_is_scoped_to_emulated_objects(device: EmulatedMeshDevice) -> None:
    # Host tensors reach the real functions while the routing is active.
    host = ttnn.from_torch(torch.tensor([[5, 6, 7]], dtype=torch.int32), dtype=ttnn.uint32)
    assert host.storage_type() == ttnn.StorageType.HOST
    assert routing.ROUTES["from_torch"].emulated({"device": None}) is False
    assert routing.ROUTES["from_torch"].emulated({"device": device}) is True
    assert routing.ROUTES["gather"].emulated({"input": host, "index": host}) is False
    on_device = ttnn.from_torch(
        torch.tensor([[5, 6, 7]], dtype=torch.int32), dtype=ttnn.uint32, device=device
    )
    assert routing.ROUTES["concat"].emulated({"tensors": [on_device], "dim": 0}) is True
    assert ttnn.to_torch(host).tolist() == [[5, 6, 7]]


def test_close_restores_ttnn_even_when_completing_the_queue_raises() -> None:
    before = _snapshot()
    device = open_emulated()

    def failing_drain() -> None:
        raise RuntimeError("device fault while draining")

    device.drain = failing_drain  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="device fault"):
        ttnn.close_mesh_device(device)
    assert device.closed and not routing.active() and _changed(before) == []


def test_open_device_opens_the_chip_when_one_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[dict[str, Any]] = []

    def chip_open(shape: Any, **kwargs: Any) -> str:
        opened.append(kwargs)
        return "the chip's MeshDevice"

    monkeypatch.setattr("ttmirror.emulator.entry.chip_present", lambda: True)
    monkeypatch.setattr(ttnn, "open_mesh_device", chip_open)
    assert open_device(num_command_queues=2, trace_region_size=4096) == "the chip's MeshDevice"
    assert opened == [{"num_command_queues": 2, "trace_region_size": 4096, "l1_small_size": 0}]
    assert not routing.active()


@pytest.mark.skipif(Path("/dev/tenstorrent").exists(), reason="a chip may be present")
def test_no_chip_here_and_ttnn_says_so() -> None:
    assert chip_count() == 0
    with pytest.raises(RuntimeError, match="No chips detected"):
        ttnn.GetNumAvailableDevices()
    info = device_info()
    assert info["device"] == "emulated" and info["chips"] == 0 and info["ttnn"] == "0.81.1"
    assert info["emulated"]["entry_point"] == "ttmirror.emulator.open_device"
    assert info["emulated"]["device_process"] is True
    before = {p.pid for p in multiprocessing.active_children()}
    device = open_device()  # no chip: the entry point gives the emulated device
    assert isinstance(device, EmulatedMeshDevice) and device_info()["routing_active"]
    # Its queues run in a device process of their own, started with it ...
    assert isinstance(device.scheduler, ProcessScheduler) and device.scheduler.policy is None
    started = {p.pid for p in multiprocessing.active_children()} - before
    assert len(started) == 1 and device.allocator.memory.is_shared()
    ttnn.close_mesh_device(device)
    assert not device_info()["routing_active"]
    # ... and stopped with it: never left behind.
    assert not started & {p.pid for p in multiprocessing.active_children()}


def test_device_info_reports_a_chip_when_one_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ttmirror.impl.devices.chip_count", lambda: 1)
    info = device_info()
    assert info["device"] == "chip" and "emulated" not in info

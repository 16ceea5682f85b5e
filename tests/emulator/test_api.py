"""The emulated device's ttnn API: an object handed to the mirror, never a patch of `ttnn`.

`ttnn`'s attributes (and `ttnn.Tensor`'s) are the same objects before, while and after the mirror
runs on an emulated device; the API object routes a call to the emulated device only when it
names an emulated object; both it and the `ttnn` module provide every function the mirror's
protocol (`impl/api.py`) names."""

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

from ttmirror.emulator import EmulatedMeshDevice, EmulatedTtnn, ProcessScheduler, open_device
from ttmirror.emulator.api import ROUTES
from ttmirror.impl import api
from ttmirror.impl.devices import chip_count, device_info, ttnn_for

from .conftest import open_emulated

# Run in a fresh interpreter: ttnn's attributes are read before any ttmirror module is imported,
# again with every ttmirror module imported and backends built, again with an emulated device
# open and the mirror running steps on it, and again after it closed.
_FRESH = r"""
import importlib, json, pkgutil, sys
import ttnn

def snapshot():
    return {**{n: id(v) for n, v in vars(ttnn).items()},
            **{"Tensor." + n: id(v) for n, v in vars(ttnn.Tensor).items()}}

def changed(before):
    now = snapshot()
    return sorted(n for n, v in before.items() if now.get(n) != v)

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
after_import = changed(before)

from ttmirror.impl.backend import get_backend
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.cli.info import backend_info
from ttmirror.impl.resolution import resolve
from ttmirror.impl.runner import Runner, RunnerConfig
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
after_build = changed(before)

runner = Runner(TtBackend(), RunnerConfig(depth=2, slots=2, rows=2))
runner.allocate()
runner.arrive(0, 3, max_tokens=4)
while runner.queue or runner.eligible():
    if runner.can_schedule():
        q = runner.schedule(); runner.combine(q); runner.launch(q); runner.readback_issue(q)
    if runner.queue and (len(runner.queue) == runner.depth or not runner.can_schedule()):
        runner.readback_complete(0)
        slot = runner.queue[0].slot
        runner.apply()
        if runner.releasable(slot):
            runner.release(slot)
device = runner.backend.device
while_open = changed(before)  # the device still open, its steps run
runner.close()
print(json.dumps({"imported": imported, "chip_side": chip_side_loaded,
                  "after_import": after_import, "after_build": after_build,
                  "while_open": while_open, "after_close": changed(before),
                  "device": info["device"], "device_type": type(device).__name__,
                  "tokens": list(runner.requests[0].delivered),
                  "emulated_calls": sum(device.api.host_calls.values()),
                  "names": len(before)}))
"""


def test_ttnn_is_untouched_before_while_and_after_an_emulated_device_runs_the_mirror() -> None:
    env = {**os.environ, "LOGURU_LEVEL": "WARNING"}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, env=env, timeout=300,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The walk really imported the mirror, the emulated device and the serving engine ...
    assert {"ttmirror.impl.tt_backend", "ttmirror.emulator.api",
            "ttmirror.emulator.entry", "ttmirror.serving.batching"} <= set(seen["imported"])
    # ... the mirror really ran on an emulated device, through its API object ...
    assert seen["device"] == "emulated" and seen["device_type"] == "EmulatedMeshDevice"
    assert len(seen["tokens"]) == 4 and seen["emulated_calls"] > 20
    # ... and every attribute of ttnn and ttnn.Tensor stayed the object it was.
    assert seen["names"] > 200
    assert seen["after_import"] == seen["after_build"] == []
    assert seen["while_open"] == [] and seen["after_close"] == []
    # Importing every module of the mirror and of the serving engine loads no emulator module.
    assert seen["chip_side"] == []


def test_the_untouched_check_sees_a_patched_attribute(device: EmulatedMeshDevice) -> None:
    """The twin: what the old routing did (ttnn.gather replaced while a device was open) is a
    change the snapshot above reports."""
    before = {n: id(v) for n, v in vars(ttnn).items()}
    original = ttnn.gather
    ttnn.gather = device.api.gather  # type: ignore[assignment]
    try:
        assert sorted(n for n, v in before.items() if id(vars(ttnn)[n]) != v) == ["gather"]
    finally:
        ttnn.gather = original


def test_each_device_has_its_own_api_and_the_mirror_gets_it_from_the_provider() -> None:
    first, second = open_emulated(), open_emulated()
    try:
        assert isinstance(first.api, EmulatedTtnn) and first.api is not second.api
        assert ttnn_for(first) is first.api and ttnn_for(second) is second.api
        assert "emulated device" in repr(first.api.gather)
        # Values, types and host-only functions are the module's own.
        assert first.api.uint32 is ttnn.uint32 and first.api.Tensor is ttnn.Tensor
        assert first.api.from_torch.golden_function is ttnn.from_torch.golden_function
    finally:
        first.api.close_mesh_device(first)
        second.close()


def test_both_apis_provide_every_function_of_the_protocol(device: EmulatedMeshDevice) -> None:
    assert len(api.FUNCTIONS) >= 20 and "gather" in api.FUNCTIONS
    assert [n for n in api.FUNCTIONS if not callable(getattr(ttnn, n, None))] == []
    # Every function the mirror calls is one the emulated device answers (none passes through
    # to a real function that a chip would have to run).
    assert [n for n in api.FUNCTIONS if n not in ROUTES] == []
    assert [n for n in api.FUNCTIONS if not callable(getattr(device.api, n))] == []
    assert set(api.TENSOR_METHODS) == {"cpu", "is_allocated", "buffer_address"}


def test_calls_reach_the_emulated_device_only_for_emulated_objects(
    device: EmulatedMeshDevice,
) -> None:
    # Host tensors reach the real functions.
    tt = device.api
    host = tt.from_torch(torch.tensor([[5, 6, 7]], dtype=torch.int32), dtype=ttnn.uint32)
    assert host.storage_type() == ttnn.StorageType.HOST
    assert ROUTES["from_torch"].emulated({"device": None}) is False
    assert ROUTES["from_torch"].emulated({"device": device}) is True
    assert ROUTES["gather"].emulated({"input": host, "index": host}) is False
    on_device = tt.from_torch(
        torch.tensor([[5, 6, 7]], dtype=torch.int32), dtype=ttnn.uint32, device=device
    )
    assert ROUTES["concat"].emulated({"tensors": [on_device], "dim": 0}) is True
    assert tt.to_torch(host).tolist() == [[5, 6, 7]]


def test_close_closes_even_when_completing_the_queue_raises() -> None:
    before = {n: id(v) for n, v in vars(ttnn).items()}
    device = open_emulated()
    tt = device.api

    def failing_drain() -> None:
        raise RuntimeError("device fault while draining")

    device.drain = failing_drain  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="device fault"):
        tt.close_mesh_device(device)
    assert device.closed and {n: id(v) for n, v in vars(ttnn).items()} == before


def test_open_device_opens_the_chip_when_one_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[dict[str, Any]] = []

    def chip_open(shape: Any, **kwargs: Any) -> str:
        opened.append(kwargs)
        return "the chip's MeshDevice"

    monkeypatch.setattr("ttmirror.emulator.entry.chip_present", lambda: True)
    monkeypatch.setattr(ttnn, "open_mesh_device", chip_open)
    assert open_device(num_command_queues=2, trace_region_size=4096) == "the chip's MeshDevice"
    assert opened == [{"num_command_queues": 2, "trace_region_size": 4096, "l1_small_size": 0}]


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
    tt = device.api
    assert isinstance(device, EmulatedMeshDevice) and device_info()["emulated_devices_open"] == 1
    # Its queues run in a device process of their own, started with it ...
    assert isinstance(device.scheduler, ProcessScheduler) and device.scheduler.policy is None
    started = {p.pid for p in multiprocessing.active_children()} - before
    assert len(started) == 1 and device.allocator.memory.is_shared()
    tt.close_mesh_device(device)
    assert device_info()["emulated_devices_open"] == 0
    # ... and stopped with it: never left behind.
    assert not started & {p.pid for p in multiprocessing.active_children()}


def test_device_info_reports_a_chip_when_one_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ttmirror.impl.devices.chip_count", lambda: 1)
    info = device_info()
    assert info["device"] == "chip" and "emulated" not in info

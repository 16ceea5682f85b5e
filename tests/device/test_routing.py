"""Routing: one switch, active only without a chip; device_info says which device is used."""

from __future__ import annotations

from pathlib import Path

import pytest
import ttnn

from ttmirror.impl.device import device_info, routing
from ttmirror.impl.device.detect import chip_count


def test_install_does_nothing_when_a_chip_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = ttnn.open_mesh_device
    monkeypatch.setattr(routing, "chip_present", lambda: True)
    assert routing.install() is False
    assert ttnn.open_mesh_device is real_open and not routing.installed()


def test_install_routes_and_uninstall_restores() -> None:
    real_open, real_to = ttnn.open_mesh_device, ttnn.Tensor.to
    with routing.emulation(force=True) as active:
        assert active and ttnn.open_mesh_device is not real_open
        assert "routed" in repr(ttnn.open_mesh_device)
    assert ttnn.open_mesh_device is real_open and ttnn.Tensor.to is real_to


@pytest.mark.skipif(Path("/dev/tenstorrent").exists(), reason="a chip may be present")
def test_no_chip_here_and_ttnn_says_so() -> None:
    assert chip_count() == 0
    with pytest.raises(RuntimeError, match="No chips detected"):
        ttnn.GetNumAvailableDevices()
    info = device_info()
    assert info["device"] == "emulated" and info["chips"] == 0 and info["ttnn"] == "0.81.1"


def test_device_info_reports_a_chip_when_one_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ttmirror.impl.device.info.chip_count", lambda: 1)
    info = device_info()
    assert info["device"] == "chip" and "emulated" not in info

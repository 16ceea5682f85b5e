"""Async scheduling resolution: auto/on/off x capable/incapable, and what `info` reports."""

from __future__ import annotations

from typing import Any

import pytest

from ttmirror.cli.info import backend_info
from ttmirror.impl.backend import Backend, Mirror, MirrorSpec, get_backend
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.devices import device_info
from ttmirror.impl.resolution import (
    AsyncSchedulingUnsupported,
    resolve,
    resolve_async_scheduling,
    runner_supports_async,
)
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.engine import Engine, EngineConfig


class HostOnlyBackend(Backend):
    """A backend that keeps the default: it cannot combine sampled ids on device."""

    name = "host-only"

    def device_kind(self) -> str:
        return "cpu"

    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        return CpuBackend().open_mirror(spec)


CAPABLE, INCAPABLE = CpuBackend(), HostOnlyBackend()


@pytest.mark.parametrize(
    ("mode", "backend", "enabled"),
    [
        ("auto", CAPABLE, True),
        ("on", CAPABLE, True),
        ("off", CAPABLE, False),
        ("auto", INCAPABLE, False),  # auto quietly resolves off
        ("off", INCAPABLE, False),
    ],
)
def test_resolution_matrix(mode: str, backend: Backend, enabled: bool) -> None:
    config = resolve(backend, mode)
    assert config.async_scheduling_enabled() is enabled
    assert config.max_concurrent_batches() == (2 if enabled else 1)


def test_on_with_an_incapable_backend_is_a_clear_error() -> None:
    with pytest.raises(AsyncSchedulingUnsupported, match=r"host-only.*does not support") as error:
        resolve(INCAPABLE, "on")
    assert "auto or off" in str(error.value)  # says what to change


class IdsOnlyBackend(CpuBackend):
    """A backend that mirrors sampled ids but whose combine is not draft-aware."""

    name = "ids-only"

    def supports_draft_aware_combine(self) -> bool:
        return False


IDS_ONLY = IdsOnlyBackend()


@pytest.mark.parametrize(
    ("mode", "backend", "enabled"),
    [
        ("auto", IDS_ONLY, False),  # sampled ids mirrored, drafts not: off, as the seed engine
        ("off", IDS_ONLY, False),
        ("auto", CAPABLE, True),  # the cpu mirror carries drafts
        ("on", CAPABLE, True),
        ("off", CAPABLE, False),
        ("auto", INCAPABLE, False),
    ],
)
def test_resolution_with_drafts_needs_a_draft_aware_combine(
        mode: str, backend: Backend, enabled: bool) -> None:
    config = resolve(backend, mode, spec_tokens=2)
    assert config.async_scheduling_enabled() is enabled
    assert config.spec_tokens == 2
    assert config.draft_aware is (backend is CAPABLE)
    assert resolve(backend, mode).async_scheduling_enabled() is (mode != "off" and backend
                                                                  is not INCAPABLE)


def test_on_with_drafts_and_no_draft_aware_combine_is_a_clear_error() -> None:
    with pytest.raises(AsyncSchedulingUnsupported, match=r"1 spec token.*no draft-aware") as e:
        resolve(IDS_ONLY, "on", spec_tokens=1)
    assert "spec_tokens=0" in str(e.value)
    with pytest.raises(ValueError, match="spec_tokens must be 0 or more"):
        resolve_async_scheduling("auto", True, spec_tokens=-1)
    assert CAPABLE.supports_draft_aware_combine()
    assert TtBackend().supports_draft_aware_combine()  # its mirror carries drafts


def test_the_default_capability_is_false_and_derives_runner_support() -> None:
    assert not INCAPABLE.supports_async_sampled_token_readback()
    assert not runner_supports_async(INCAPABLE)
    assert runner_supports_async(CpuBackend()) and runner_supports_async(TtBackend())


def test_unknown_modes_and_backends_are_rejected() -> None:
    with pytest.raises(ValueError, match="auto, on, off"):
        resolve_async_scheduling("maybe", True)
    with pytest.raises(ValueError, match="no cuda backend"):
        get_backend("cuda")
    with pytest.raises(ValueError, match="choose one of: cpu, tt"):
        get_backend("npu")


def test_the_engine_runs_at_the_resolved_depth() -> None:
    assert Engine(CpuBackend()).runner.depth == 2
    assert Engine(HostOnlyBackend()).runner.depth == 1
    assert Engine(CpuBackend(), EngineConfig(async_scheduling="off")).runner.depth == 1
    with pytest.raises(AsyncSchedulingUnsupported):
        Engine(HostOnlyBackend(), EngineConfig(async_scheduling="on"))


@pytest.mark.parametrize("name", ["tt", "cpu"])
def test_info_reports_the_capability_and_async_on(name: str) -> None:
    info: dict[str, Any] = backend_info(name)
    assert info["backend"] == name
    assert info["device"] == ("cpu" if name == "cpu" else device_info()["device"])
    assert info["supports_async_sampled_token_readback"] is True
    assert info["async_scheduling_enabled"] is True
    assert info["max_concurrent_batches"] == 2


def test_info_with_async_off() -> None:
    info = backend_info("tt", async_scheduling="off")
    assert info["supports_async_sampled_token_readback"] is True
    assert (info["async_scheduling_enabled"], info["max_concurrent_batches"]) == (False, 1)


def test_a_chips_device_is_known_without_loading_any_other_provider() -> None:
    """On a chip the mirror never loads the emulator: a `ttnn.MeshDevice` is the chip's by its
    type alone (run in a fresh interpreter, where nothing has loaded a provider yet)."""
    import subprocess
    import sys

    probe = ("import sys, ttnn; from ttmirror.impl import devices\n"
             "class FakeChip(ttnn.MeshDevice):\n"
             "    def __init__(self): pass\n"
             "loaded = lambda: any(m.startswith('ttmirror.emulator') for m in sys.modules)\n"
             "kind = devices.provider_of(FakeChip()).kind\n"
             "after_chip = loaded()\n"
             "other = devices.provider_of(object()).kind\n"
             "print(kind, after_chip, other, loaded())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # The chip's device loaded nothing; an unknown object asked the plugged-in providers, which
    # loads the emulator (the twin: the check above can see a load).
    assert done.stdout.split() == ["chip", "False", "chip", "True"]

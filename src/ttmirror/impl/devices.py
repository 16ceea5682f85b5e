"""Where the mirror's device comes from: one seam, so the mirror never knows which it has.

A `DeviceProvider` opens a 1x1 mesh device, knows its own devices, and hands out the ttnn API each
is driven through (`ttnn_for(device)`, typed as `api.Ttnn`). A chip's provider is ttnn itself
(`CHIP`): its devices are driven through the `ttnn` module. Another provider plugs in from outside
through the entry point group ``ttmirror.devices`` (the emulated device, `ttmirror.emulator`,
declares itself there in pyproject.toml), so nothing in the mirror imports it:

    device = open_device(num_command_queues=2, trace_region_size=1 << 20)
    tt = ttnn_for(device)  # what every call on it goes through: tt.add(...), tt.record_event(...)
    # a chip when one is present (and TTMIRROR_DEVICE is not "emulated"), else a provider
    # plugged in; TtBackend(provider=...) or open_device(provider=...) chooses one explicitly

`bind_sampling_identity` is the one thing a provider may do beside ttnn: tell a device which
request and position each row of `ttnn.sampling` holds (an emulated device's sampler keys its
draw on them); on a chip it does nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import ttnn

from .api import Ttnn

OVERRIDE_VARIABLE = "TTMIRROR_DEVICE"
"""TTMIRROR_DEVICE=emulated: use a plugged-in provider even where a chip exists (to compare)."""
GROUP = "ttmirror.devices"
"""The entry point group of device providers: each names a callable returning a provider."""


@runtime_checkable
class DeviceProvider(Protocol):
    """Opens mesh devices of one kind and recognises them."""

    kind: str
    """"chip", or what the provider stands for (e.g. "emulated")."""

    def open(self, *, num_command_queues: int, trace_region_size: int,
             l1_small_size: int) -> Any:
        """A 1x1 mesh device with that many command queues and that trace region."""

    def owns(self, device: Any) -> bool:
        """Is `device` one this provider opened?"""

    def ttnn(self, device: Any) -> Ttnn:
        """The ttnn API `device` is driven through."""

    def bind_sampling_identity(self, device: Any, request_ids: Any, positions: Any) -> None:
        """Tell `device` each sampling row's request and position (device tensors)."""

    def info(self) -> dict[str, Any]:
        """Facts for `ttmirror info` (no device is opened to find them)."""


class NoDevice(RuntimeError):
    """No chip is present and no other device provider is plugged in."""


@functools.cache
def chip_count() -> int:
    """Number of chips ttnn can open; 0 means a plugged-in provider must be used."""
    if os.environ.get(OVERRIDE_VARIABLE) == "emulated":
        return 0
    # Without the kernel driver's device nodes there is no chip. Checking them first avoids
    # ttnn.GetNumAvailableDevices, which builds the cluster and logs a TT_FATAL when it is empty.
    if not Path("/dev/tenstorrent").exists():
        return 0
    try:
        return int(ttnn.GetNumAvailableDevices())
    except RuntimeError as error:  # raised as "TT_FATAL ... No chips detected in the cluster"
        if "No chips detected" in str(error) or "num_chips > 0" in str(error):
            return 0
        raise


def chip_present() -> bool:
    return chip_count() > 0


class Chip:
    """A Tenstorrent chip through ttnn, untouched."""

    kind = "chip"

    def open(self, *, num_command_queues: int, trace_region_size: int,
             l1_small_size: int) -> Any:
        return ttnn.open_mesh_device(
            ttnn.MeshShape(1, 1),
            num_command_queues=num_command_queues,
            trace_region_size=trace_region_size,
            l1_small_size=l1_small_size,
        )

    def owns(self, device: Any) -> bool:
        return isinstance(device, ttnn.MeshDevice)

    def ttnn(self, device: Any) -> Ttnn:
        return cast(Ttnn, ttnn)  # the module itself: nothing stands between a chip and ttnn

    def bind_sampling_identity(self, device: Any, request_ids: Any, positions: Any) -> None:
        pass  # a chip's sampler keys its draw itself

    def info(self) -> dict[str, Any]:
        return {}


CHIP = Chip()


@functools.cache
def plugged_in() -> tuple[DeviceProvider, ...]:
    """The providers the installed distributions declare (`GROUP`), by entry point name."""
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: e.name):
        provider = entry.load()()
        if not isinstance(provider, DeviceProvider):
            raise TypeError(f"entry point {entry.name} = {entry.value} of {GROUP} is no "
                            "DeviceProvider")
        found.append(provider)
    return tuple(found)


def default_provider() -> DeviceProvider:
    """The chip's when one is present, else the first provider plugged in."""
    if chip_present():
        return CHIP
    others = plugged_in()
    if not others:
        raise NoDevice("no Tenstorrent chip is present and no other device provider is "
                       f"installed (entry point group {GROUP}: install ttmirror, which declares "
                       "its emulated device there)")
    return others[0]


def provider_of(device: Any) -> DeviceProvider:
    """The provider that opened `device`: a chip's `ttnn.MeshDevice` is the chip's (no other
    provider is loaded to say so), else the plugged-in provider that claims it, else the chip's
    (a device object this process did not open through a provider)."""
    if CHIP.owns(device):
        return CHIP
    return next((p for p in plugged_in() if p.owns(device)), CHIP)


def open_device(*, num_command_queues: int = 2, trace_region_size: int = 0,
                l1_small_size: int = 0, provider: DeviceProvider | None = None) -> Any:
    """A 1x1 mesh device from `provider` (default: `default_provider()`)."""
    return (provider or default_provider()).open(
        num_command_queues=num_command_queues, trace_region_size=trace_region_size,
        l1_small_size=l1_small_size)


def ttnn_for(device: Any) -> Ttnn:
    """The ttnn API to drive `device` through: the `ttnn` module for a chip's, the provider's
    own API object for a device another provider opened."""
    return provider_of(device).ttnn(device)


def bind_sampling_identity(device: Any, request_ids: Any, positions: Any) -> None:
    """Tell `device` which request and position each sampling row holds; a chip ignores it."""
    provider_of(device).bind_sampling_identity(device, request_ids, positions)


def device_info(provider: DeviceProvider | None = None) -> dict[str, Any]:
    """{"device": "chip" | "emulated" | ..., "chips", "ttnn", ...}: what `ttmirror info --backend
    tt` reports of the device a backend would open (none is opened)."""
    chosen = provider or default_provider()
    return {
        "device": chosen.kind,
        "chips": chip_count(),
        "ttnn": importlib.metadata.version("ttnn"),
        "override_variable": OVERRIDE_VARIABLE,
        **chosen.info(),
    }

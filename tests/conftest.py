"""Shared fixtures: explorations are costly, so each bound is explored once per session."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import cache

import pytest

from ttmirror.model.explore import Exploration, explore
from ttmirror.model.state import Bounds


@cache
def _explored(bounds: Bounds) -> Exploration:
    return explore(bounds)


@pytest.fixture(scope="session")
def explored() -> Callable[[Bounds], Exploration]:
    """The exploration of some bounds, computed once per test session."""
    return _explored


@pytest.fixture(scope="session")
def default_run() -> Exploration:
    return _explored(Bounds())


@pytest.fixture(autouse=True)
def every_emulated_device_closed() -> Iterator[None]:
    """Fail a test that leaves an emulated device open: ttnn stays routed until it closes."""
    yield
    routing = sys.modules.get("ttmirror.impl.device.routing")  # never imported: nothing to check
    if routing is None:
        return
    left = routing.open_devices()
    for device in left:
        device.close()
    if left:
        pytest.fail(f"the test left {len(left)} emulated device(s) open; ttnn was routed to them")

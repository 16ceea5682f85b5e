"""Shared fixtures: explorations are costly, so each bound is explored once per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from functools import cache

import pytest
import torch

from ttmirror.model.explore import Exploration, explore
from ttmirror.model.state import RING, Bounds

# The emulated device's ops and the tiny models' forwards are a few dozen to a few thousand
# elements each: torch's intra-op threads only spin against each other and against the suite's
# worker processes (on 2 cores, the tiny-model battery ran 7 times slower with 2 threads). One
# thread here, and in every command a test starts (the variable is inherited); the results do
# not depend on it, only the time.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


@cache
def _explored(bounds: Bounds) -> Exploration:
    return explore(bounds)


@pytest.fixture(scope="session")
def explored() -> Callable[[Bounds], Exploration]:
    """The exploration of some bounds, computed once per test session."""
    return _explored


@pytest.fixture(scope="session")
def default_run() -> Exploration:
    return _explored(RING)


@pytest.fixture(autouse=True)
def every_emulated_device_closed() -> Iterator[None]:
    """Fail a test that leaves an emulated device open (and with it, perhaps, its device
    process)."""
    yield
    device = sys.modules.get("ttmirror.emulator.device")  # never imported: nothing to check
    if device is None:
        return
    left = list(device.OPEN)
    for each in left:
        each.close()
    if left:
        pytest.fail(f"the test left {len(left)} emulated device(s) open")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Let the test session go when it ends, so it does not outlive interpreter shutdown.

    pytest's assertion-rewriting import hook keeps the `Config`, and through it the `Session`:
    every collected item with its parameters, and what those reach (ttnn objects among them).
    The hook is the `__loader__` of every module it imported (test modules, conftests, and the
    Hypothesis and anyio plugin packages), and at shutdown some of those namespaces outlive
    their modules (typing's overload registry holds Hypothesis' functions, for one): the whole
    session then survived finalisation, and nanobind reported the ttnn objects it reaches as
    leaked. pytest takes the hook out of `sys.meta_path` right after this hook; doing that here
    first, then dropping the hook's `Config`, releases the harness's state, nothing of ours.
    """
    for finder in list(sys.meta_path):
        if getattr(finder, "config", None) is config:
            sys.meta_path.remove(finder)
            finder.config = None  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def own_example_database(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's `ttmirror fuzz` gets an example database of its own: the default one in the
    working directory would carry one test's failures into the next run (replayed first, they
    change what a test sees)."""
    from ttmirror.conformance.campaigns.databases import ENV

    monkeypatch.setenv(ENV, str(tmp_path_factory.mktemp("hypothesis-db")))

"""Shared fixtures: explorations are costly, so each bound is explored once per session."""

from __future__ import annotations

from collections.abc import Callable
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

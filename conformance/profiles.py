"""Hypothesis profiles for the conformance suite: ``ci``, ``dev`` and ``nightly``.

- ``ci``: deterministic (derandomized, no example database), sized so the whole conformance
  suite stays within CI's budget on two cores;
- ``dev``: random, with the local example database, so a failure found once is replayed first;
- ``nightly``: long runs, more steps per example.

Select with ``TTMIRROR_PROFILE`` (default ``ci``) or ``--profile`` on the command line.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES = ("ci", "dev", "nightly")
ENV = "TTMIRROR_PROFILE"

_quiet = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

settings.register_profile(
    "ci", max_examples=150, stateful_step_count=60, derandomize=True, database=None,
    deadline=None, suppress_health_check=_quiet, print_blob=False,
)
settings.register_profile(
    "dev", max_examples=400, stateful_step_count=60, deadline=None,
    suppress_health_check=_quiet, print_blob=True,
)
settings.register_profile(
    "nightly", max_examples=20_000, stateful_step_count=120, deadline=None,
    suppress_health_check=_quiet, print_blob=True,
)


def profile(name: str | None = None) -> settings:
    """The settings of profile `name` (default: $TTMIRROR_PROFILE, else ci)."""
    name = name or os.environ.get(ENV) or "ci"
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}")
    return settings.get_profile(name)

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

_quiet = [
    # An example drives a real (emulated) device through up to 60 moves, each checked against
    # the model: generation is slow by the nature of the test, not by a slow strategy.
    HealthCheck.too_slow,
    # Most rules' preconditions are false in most states (a step can be combined only once it is
    # scheduled...): rule selection filters by design.
    HealthCheck.filter_too_much,
    # Long stateful examples (60 steps, each drawing an action instance) exceed the default
    # buffer in the deep states the suite exists to reach.
    HealthCheck.data_too_large,
]

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


SERVING: dict[str, tuple[int, int]] = {"ci": (12, 40), "dev": (60, 60), "nightly": (2_000, 100)}
"""The serving loop's machine (`serving_loop.py`) per profile, as (examples, steps): each example
loads a model and serves it twice on the emulated device, so it runs far fewer than the lockstep."""


def serving_settings(name: str | None = None) -> settings:
    """The serving loop machine's settings under profile `name` (default as `profile`)."""
    name = name or os.environ.get(ENV) or "ci"
    examples, steps = SERVING[name]
    return settings(profile(name), max_examples=examples, stateful_step_count=steps)

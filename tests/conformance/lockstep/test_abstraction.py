"""The abstraction maps the runner's enums onto the model's by name, never by number."""

from __future__ import annotations

from enum import IntEnum

import pytest

from ttmirror.conformance.lockstep.abstraction import phase_name, status_name
from ttmirror.impl import runner
from ttmirror.model import state


def test_runner_and_model_enums_have_the_same_names() -> None:
    assert [s.name for s in runner.Status] == [s.name for s in state.Status]
    assert [p.name for p in runner.Phase] == [p.name for p in state.Phase]
    assert all(status_name(s) == s.name for s in runner.Status)
    assert all(phase_name(p) == p.name for p in runner.Phase)


def test_a_renumbered_runner_enum_still_maps_by_name() -> None:
    # The same names with other values: a mapping by number would now pick the wrong member.
    shifted = IntEnum("Status", [(s.name, 10 + s.value) for s in reversed(runner.Status)])
    assert [status_name(s) for s in shifted] == [s.name for s in reversed(runner.Status)]  # type: ignore[arg-type]


def test_a_status_the_model_lacks_is_refused() -> None:
    extra = IntEnum("Status", [("SWAPPED_OUT", 0)])
    with pytest.raises(KeyError, match="SWAPPED_OUT"):
        status_name(extra.SWAPPED_OUT)  # type: ignore[attr-defined,arg-type]

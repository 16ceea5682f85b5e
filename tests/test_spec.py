"""The spec's generated slot-lifecycle diagram matches the model."""

from __future__ import annotations

from ttmirror import specdoc
from ttmirror.model.explore import Exploration


def test_spec_slot_lifecycle_is_up_to_date(default_run: Exploration) -> None:
    committed = specdoc.current(specdoc.SPEC.read_text())
    assert committed == specdoc.block(default_run), (
        "specs/mirrored-sampled-ids.md is out of date: run `make spec`"
    )


def test_spec_names_every_action_and_invariant() -> None:
    from ttmirror.model.actions import ALL_ACTIONS
    from ttmirror.model.invariants import GRAPH_PROPERTIES, INVARIANTS, SOMETIMES

    text = specdoc.SPEC.read_text()
    for name in (*ALL_ACTIONS, *(i.name for i in INVARIANTS), *GRAPH_PROPERTIES,
                 *(c.name for c in SOMETIMES)):
        assert f"`{name}`" in text, name

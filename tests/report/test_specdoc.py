"""The spec's and the command line guide's generated blocks match the model and the manifest."""

from __future__ import annotations

from ttmirror import manifest
from ttmirror.model.explore import Exploration
from ttmirror.report import specdoc


def test_spec_slot_lifecycle_is_up_to_date(default_run: Exploration) -> None:
    committed = specdoc.current(specdoc.SPEC.read_text())
    assert committed == specdoc.block(default_run), (
        "specs/mirrored-sampled-ids.md is out of date: run `make spec`"
    )


def test_every_generated_table_is_up_to_date(default_run: Exploration) -> None:
    entries = manifest.load()
    for path, blocks in ((specdoc.SPEC, specdoc.spec_blocks(default_run, entries)),
                         (specdoc.COMMANDS, specdoc.guide_blocks(entries))):
        text = path.read_text()
        for name, fresh in blocks.items():
            assert specdoc.current(text, name) == fresh, f"{path.name}: {name}: run `make spec`"


def test_the_tables_quote_the_manifest() -> None:
    text = specdoc.SPEC.read_text()
    default = manifest.entry("default")
    assert f"| {default.states:,} | {default.transitions:,} |" in text
    bad = manifest.entry("depth-3-two-slots")
    assert f"| `{bad.violated}` | {bad.length} |" in text


def test_spec_names_every_action_and_invariant() -> None:
    from ttmirror.model.actions import ALL_ACTIONS
    from ttmirror.model.invariants import GRAPH_PROPERTIES, INVARIANTS, SOMETIMES

    text = specdoc.SPEC.read_text()
    for name in (*ALL_ACTIONS, *(i.name for i in INVARIANTS), *GRAPH_PROPERTIES,
                 *(c.name for c in SOMETIMES)):
        assert f"`{name}`" in text, name

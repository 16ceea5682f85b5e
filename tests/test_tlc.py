"""The TLA+ twin agrees with the Python explorer: states, verdicts, graph, counterexamples."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ttmirror import manifest, tlc
from ttmirror.model.explore import Exploration
from ttmirror.model.state import Bounds

SMALL = Bounds(requests=1)
Explored = Callable[[Bounds], Exploration]


@pytest.mark.parametrize("name", sorted(tlc.CONFIGS))
def test_committed_configs_match_their_bounds(name: str) -> None:
    committed = (tlc.SPEC.parent / name).read_text()
    assert committed == tlc.cfg_text(tlc.CONFIGS[name]), "run `make spec` to regenerate"


def test_tla_values_parse() -> None:
    assert tlc.tla_value("<<>>") == () and tlc.tla_value("<< >>") == ()
    assert tlc.tla_value("<<<<0, 1>>, <<-1, -1>>>>") == ((0, 1), (-1, -1))
    assert tlc.tla_value('{"a"}') == {"a"}
    assert tlc.tla_value("(0 :> [x |-> TRUE] @@ 1 :> [x |-> FALSE])") == {
        0: {"x": True}, 1: {"x": False}
    }


def test_small_bound_agrees_on_everything(explored: Explored) -> None:
    result = tlc.cross_check(SMALL, explored(SMALL))
    assert result["python_states"] == result["tlc_states"] == manifest.entry("small").states
    assert result["graph"]["same_nodes"] and result["graph"]["same_edges"]
    assert result["graph"]["tlc_edges"] == result["graph"]["python_edges"] > 0
    assert result["verdicts"]["agree"] and result["verdicts"]["tlc"]["violated"] is None
    off = result["guard_off"]
    assert off["tlc_violated"] == off["python_violated"] == "StaleHostIdsGuard"
    assert off["tlc_length"] == off["python_length"] == manifest.entry("small-guard-off").length
    assert result["agree"]


@pytest.mark.parametrize(
    "option",
    [SMALL._replace(preempt_policy="drop"), SMALL._replace(prefill_chunks=2),
     SMALL._replace(host_sync=True)],
    ids=["preempt-drop", "prefill-chunks-2", "host-sync"],
)
def test_each_option_agrees_state_for_state(option: Bounds, explored: Explored) -> None:
    result = tlc.cross_check(option, explored(option))
    assert result["python_states"] == result["tlc_states"] > 0
    assert result["graph"]["same_nodes"] and result["graph"]["same_edges"]
    assert result["agree"]


@pytest.mark.parametrize(
    "name", ["small-faults",
             # Two requests, one row each: a fault can spare the other request's row in flight.
             "small-faults-two-requests"],
)
def test_faults_agree_state_for_state(name: str, explored: Explored) -> None:
    bounds, states = manifest.entry(name).bounds, manifest.entry(name).states
    ex = explored(bounds)
    assert any(name == "fault" for _, _, name in tlc.python_edges(ex))
    result = tlc.cross_check(bounds, ex)
    assert result["python_states"] == result["tlc_states"] == states
    assert result["graph"]["same_nodes"] and result["graph"]["same_edges"]
    assert result["verdicts"]["agree"] and result["verdicts"]["tlc"]["violated"] is None
    assert result["agree"]


def test_graph_comparison_can_disagree(explored: Explored, tmp_path: Path) -> None:
    # TLC's graph without abort beside the explorer's with it: the check must notice.
    run = tlc.run_tlc(SMALL._replace(abort=False), tmp_path, dump=True)
    assert run.dot is not None
    cmp = tlc.compare_graphs(explored(SMALL), run.dot)
    assert not cmp.same_nodes and not cmp.same_edges
    assert cmp.only_python and not cmp.only_tlc  # aborts exist only on the python side


def test_unreadable_tlc_output_is_an_error() -> None:
    with pytest.raises(tlc.TlcError, match="did not finish"):
        tlc.parse_output("Error: something broke\n", 0.1, None)

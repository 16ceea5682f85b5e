"""The TLA+ twin agrees with the Python explorer: states, verdicts, graph, counterexamples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from ttmirror import manifest, tlc
from ttmirror.model.explore import Exploration
from ttmirror.model.state import RING, SPEC_VARIANTS, Bounds

SMALL = RING._replace(requests=1)
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


# --- the graph comparison sees more than sizes --------------------------------------------------
# Each perturbation below keeps TLC's graph the explorer's size (as many states, as many edges),
# so only comparing the states and edges themselves, not their counts, can notice it.


@pytest.fixture(scope="module")
def small_dot(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """TLC's dumped state graph at one request, line by line (one TLC run for the module)."""
    run = tlc.run_tlc(SMALL, tmp_path_factory.mktemp("tlc"), dump=True)
    assert run.violated is None and run.dot is not None
    return run.dot.read_text().splitlines()


def _compare(lines: list[str], ex: Exploration, tmp_path: Path) -> tlc.GraphComparison:
    """compare_graphs on a perturbed dump, once its sizes are checked equal to the explorer's."""
    dot = tmp_path / "perturbed.dot"
    dot.write_text("\n".join(lines) + "\n")
    nodes, _ = tlc.parse_dot(dot)
    cmp = tlc.compare_graphs(ex, dot)
    assert len(set(nodes.values())) == len(ex.states)
    assert cmp.tlc_edges == cmp.python_edges > 0
    return cmp


def _edges(lines: list[str]) -> list[tuple[int, str, str, str]]:
    """(line number, source, target, TLA+ action) of each transition line of a dump."""
    return [(i, m.group(1), m.group(2), m.group(3)) for i, line in enumerate(lines)
            if (m := tlc._EDGE.match(line)) and m.group(1) != m.group(2)]


def _listed_once(edges: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """The transitions the dump lists once: changing that line changes the edge set."""
    times = Counter(e[1:] for e in edges)
    return [e for e in edges if times[e[1:]] == 1]


def test_the_unperturbed_dump_agrees(small_dot: list[str], explored: Explored,
                                     tmp_path: Path) -> None:
    cmp = _compare(small_dot, explored(SMALL), tmp_path)
    assert cmp.same_nodes and cmp.same_edges and not cmp.only_python and not cmp.only_tlc


def test_one_edge_repointed_is_a_disagreement(small_dot: list[str], explored: Explored,
                                              tmp_path: Path) -> None:
    edges = _edges(small_dot)
    present = {(src, dst, name) for _, src, dst, name in edges}
    targets = {dst for _, _, dst, _ in edges}
    # The first transition that can move to a state it does not reach by that action.
    i, src, dst, name, other = next(
        (at, src, dst, name, t) for at, src, dst, name in _listed_once(edges)
        for t in sorted(targets) if t not in (src, dst) and (src, t, name) not in present)
    lines = list(small_dot)
    lines[i] = lines[i].replace(f"{src} -> {dst} ", f"{src} -> {other} ", 1)
    cmp = _compare(lines, explored(SMALL), tmp_path)
    assert cmp.same_nodes and not cmp.same_edges
    model_name = tlc.ACTIONS[name]
    assert cmp.only_python == [f"{model_name} edge"] and cmp.only_tlc == [f"{model_name} edge"]


def test_one_action_renamed_is_a_disagreement(small_dot: list[str], explored: Explored,
                                              tmp_path: Path) -> None:
    edges = _edges(small_dot)
    present = {(src, dst, name) for _, src, dst, name in edges}
    # A combine relabelled launch, on an edge that has no launch: same edge, wrong action.
    i = next(at for at, src, dst, name in _listed_once(edges)
             if name == "Combine" and (src, dst, "Launch") not in present)
    lines = list(small_dot)
    lines[i] = lines[i].replace('[label="Combine"', '[label="Launch"', 1)
    cmp = _compare(lines, explored(SMALL), tmp_path)
    assert cmp.same_nodes and not cmp.same_edges
    assert cmp.only_python == ["combine edge"] and cmp.only_tlc == ["launch edge"]


def _node_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if tlc._NODE.match(line)]


def test_one_state_mapped_elsewhere_is_a_disagreement(small_dot: list[str], explored: Explored,
                                                      tmp_path: Path) -> None:
    """The initial state's next_slot changed: a state the explorer never reaches (nothing is
    scheduled before allocation), in place of one it does."""
    ex = explored(SMALL)
    first = _node_lines(small_dot)[0]
    assert "allocated = FALSE" in small_dot[first]
    lines = list(small_dot)
    lines[first] = lines[first].replace("next_slot = 0", "next_slot = 1", 1)
    assert lines[first] != small_dot[first]
    cmp = _compare(lines, ex, tmp_path)
    assert not cmp.same_nodes and not cmp.same_edges
    assert len(cmp.only_python) == len(cmp.only_tlc) == 2  # the state, and its allocate edge


def test_two_states_swapped_is_a_disagreement(small_dot: list[str], explored: Explored,
                                              tmp_path: Path) -> None:
    """Two TLC states exchange their variables: each maps to another model state, so the state
    sets are equal, and only the edges, re-attached, can tell."""
    first, second = _node_lines(small_dot)[:2]
    label = tlc._NODE.match  # group 2 is the label: swap it, keep the ids (and so the edges)
    a, b = label(small_dot[first]), label(small_dot[second])
    assert a is not None and b is not None and a.group(2) != b.group(2)
    lines = list(small_dot)
    lines[first] = small_dot[first].replace(a.group(2), b.group(2), 1)
    lines[second] = small_dot[second].replace(b.group(2), a.group(2), 1)
    cmp = _compare(lines, explored(SMALL), tmp_path)
    assert cmp.same_nodes and not cmp.same_edges
    assert cmp.only_python and cmp.only_tlc


# --- speculative decoding (rule 13) ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["spec-small", "spec2-small"])
def test_spec_tokens_agree_state_for_state(name: str, explored: Explored) -> None:
    bounds, states = manifest.entry(name).bounds, manifest.entry(name).states
    assert bounds.spec_tokens >= 1
    ex = explored(bounds)
    result = tlc.cross_check(bounds, ex)
    assert result["python_states"] == result["tlc_states"] == states
    assert result["graph"]["same_nodes"] and result["graph"]["same_edges"]
    assert result["graph"]["tlc_edges"] == result["graph"]["python_edges"] > 0
    # Some launch has more than one verdict (a in 0..K): one edge each, on both sides.
    verdicts = Counter(src for src, _, n in tlc.python_edges(ex) if n == "launch")
    assert max(verdicts.values()) == bounds.spec_tokens + 1
    assert result["verdicts"]["agree"] and result["verdicts"]["tlc"]["violated"] is None
    assert result["guard_off"]["agree"]
    assert result["agree"]


@pytest.mark.parametrize(
    # Drops forget a request's drafts, counts and positions: preempted (drop), failed requests.
    "name", ["spec-small-preempt-drop", "spec-small-faults"],
)
def test_spec_drops_agree_state_for_state(name: str, explored: Explored, tmp_path: Path) -> None:
    bounds, states = manifest.entry(name).bounds, manifest.entry(name).states
    run = tlc.run_tlc(bounds, tmp_path, dump=True)
    assert run.violated is None and run.distinct_states == states and run.dot is not None
    cmp = tlc.compare_graphs(explored(bounds), run.dot)
    assert cmp.same_nodes and cmp.same_edges and cmp.tlc_edges == cmp.python_edges > 0


@pytest.mark.parametrize("variant", SPEC_VARIANTS)
def test_spec_variants_fail_alike(variant: str, explored: Explored, tmp_path: Path) -> None:
    (config,) = [n for n, b in tlc.CONFIGS.items() if b.variant == variant]
    bounds = tlc.CONFIGS[config]
    assert bounds == manifest.entry(variant).bounds and bounds.requests == 1
    run = tlc.run_tlc(bounds, tmp_path)
    assert tlc.python_verdict(explored(bounds)) == (run.violated, run.trace_len)
    assert (run.violated, run.trace_len) == (manifest.entry(variant).violated,
                                             manifest.entry(variant).length)


def test_spec_tokens_zero_keeps_every_committed_config() -> None:
    """The spec-decode constants are off in every configuration without drafts."""
    for name, bounds in tlc.CONFIGS.items():
        text = tlc.cfg_text(bounds)
        assert f"SpecTokens = {bounds.spec_tokens}\n" in text, name
        if not bounds.spec_tokens:
            assert all(f"{c} = FALSE" in text for c in (
                "PositionsAdvanceBySpec", "RejectedDraftNewest", "ReenteringDraftsFromDevice",
                "PlaceholdersDrainByOne")), name

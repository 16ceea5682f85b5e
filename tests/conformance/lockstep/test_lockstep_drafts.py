"""The lockstep with drafts (spec rule 13): each part of the device data of drafts is seen as the
command writing it completes and compared with the model; each launch is offered only with the
counts the run's drafter makes the verification accept; every edge of a spec-decode bound is
walked, in passes under patterns of the drafter's guesses, in every configuration; and each new
check, fed device data where it must fail, fails.

`ttmirror fuzz --spec-tokens 1` at the spec-decode default bound (two requests of three tokens)
runs off CI; here the bound is one request of three tokens (1,602 states, 3,774 edges) with one
draft, and with two drafts (2,499 states, 5,936 edges).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from ttmirror import manifest
from ttmirror.cli import main
from ttmirror.conformance.bugs import BUG_VARIABLE
from ttmirror.conformance.campaigns import branches, campaign, profiles, walks
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.lockstep import patterns
from ttmirror.conformance.lockstep.abstraction import seen_in
from ttmirror.conformance.lockstep.harness import Lockstep, prompts_from
from ttmirror.conformance.lockstep.replay import CONFORMS, INVALID, replay
from ttmirror.conformance.traces import itf
from ttmirror.conformance.traces.moves import Divergence, Drafter, Move
from ttmirror.model.actions import Action, successors
from ttmirror.model.explore import Exploration
from ttmirror.model.state import RING, Bounds
from ttmirror.resources import REGRESSIONS

SPEC = RING._replace(requests=1, max_tokens=3, spec_tokens=1)
SPEC2 = RING._replace(requests=1, max_tokens=3, spec_tokens=2)
RUNS = [("tt", "eager-2cq"), ("tt", "eager-1cq"), ("tt", "traced"), ("cpu", "host")]
type Explored = Callable[[Bounds], Exploration]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The emulated device's ops are a few dozen elements each: one torch thread runs them
    faster than two (what the walk workers do too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _accepted_taken(cov: Coverage) -> Counter[int]:
    """Per accepted count, the covered launch edges where a row accepted it (each launch's
    counts were compared with the device's, so the implementation accepted them)."""
    taken: Counter[int] = Counter()
    for u, v in cov.edges:
        for label in cov.ex.graph.edges[u, v]["action"].split(" | "):
            parsed = patterns.parse_launch(label)
            if parsed is not None:
                taken.update(a for a, row in zip(parsed[1], cov.ex.states[u].queue[parsed[0]].rows,
                                                 strict=True) if row.spec)
    return taken


@pytest.mark.parametrize(("backend", "config"), [r for r in RUNS if r != ("tt", "eager-2cq")])
def test_branch_walks_cover_every_edge_of_a_spec_bound(backend: str, config: str,
                                                       explored: Explored) -> None:
    ex = explored(SPEC)
    cov = Coverage(ex)
    report = branches.run(cov, backend, seed=0, seconds=math.inf, config=config)
    assert report.failure is None and report.stopped == "covered", report.failure
    assert cov.edges_covered == 1.0 and report.unreachable == 0
    # Sometimes: one pattern cannot take every launch edge, so it took several; and launches
    # accepting 0 and 1 drafts were both walked (and their device counts compared).
    assert report.passes >= 2
    assert set(_accepted_taken(cov)) == {0, 1}


def test_two_drafts_walk_every_edge_on_the_cpu(explored: Explored) -> None:
    ex = explored(SPEC2)
    cov = Coverage(ex)
    report = branches.run(cov, "cpu", seed=1, seconds=math.inf)
    assert report.failure is None and cov.edges_covered == 1.0 and report.passes >= 3
    assert set(_accepted_taken(cov)) == {0, 1, 2}


def test_fuzz_walks_every_edge_of_the_spec_bound(tmp_path: Path) -> None:
    """`ttmirror fuzz --requests 1 --spec-tokens 1 --json` (eager-2cq, the default state rows
    with vLLM's freedoms): Hypothesis, then the passes; every edge covered, none out of a
    drafter's reach."""
    env = {k: v for k, v in os.environ.items() if k != BUG_VARIABLE} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror.cli", "fuzz", "--requests", "1", "--spec-tokens", "1",
         "--examples", "20", "--jobs", "1", "--json", "--traces", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["bounds"]["spec_tokens"] == 1 and report["bounds"]["max_tokens"] == 3
    edges = manifest.entry("rows-spec-small").transitions
    assert report["edges_covered"] == 1.0 and report["edges"] == report["total_edges"] == edges
    assert report["passes"] >= 2 and report["unreachable_edges"] == 0
    assert report["stopped"] == "covered" and report["failure"] is None
    assert "draft lanes" in report["observation"]


@pytest.mark.parametrize(("backend", "config"), [("tt", "eager-2cq"), ("cpu", "host")])
def test_the_state_machine_draws_drafters_and_conforms(backend: str, config: str) -> None:
    drafters: set[int] = set()
    accepted: Counter[str] = Counter()

    def record(ls: Lockstep) -> None:
        assert ls.drafter is not None
        drafters.add(ls.drafter.seed)
        accepted.update({k: v for k, v in ls.runner.stats.items() if k.startswith("accepted_")})

    result = campaign.run(SPEC, backend, profiles.profile("ci"), on_run=record, config=config,
                          max_examples=40)
    assert not result.failed, result.error
    assert len(drafters) > 5  # each example draws its drafter
    assert accepted["accepted_0"] and accepted["accepted_1"]  # both verdicts happened


@pytest.mark.parametrize("config", ["eager-2cq", "eager-1cq", "traced"])
def test_two_drafts_conform_in_each_configuration(config: str, explored: Explored) -> None:
    result = campaign.run(SPEC2, "tt", profiles.profile("ci"), config=config, max_examples=25)
    assert not result.failed, result.error
    # Planned walks, each with the drafter its path needs: none, one and both drafts accepted.
    cov = Coverage(explored(SPEC2))
    report = walks.run(cov, "tt", seed=0, until=1.0, seconds=math.inf, config=config,
                       max_walks=40)
    assert report.failure is None and report.walks == 40
    assert set(_accepted_taken(cov)) == {0, 1, 2}


def test_planned_walks_carry_the_guesses_their_path_needs(explored: Explored) -> None:
    ex = explored(SPEC)
    cov = Coverage(ex)
    report = walks.run(cov, "tt", seed=0, until=1.0, seconds=math.inf, max_walks=40)
    assert report.failure is None and report.walks == 40
    assert set(_accepted_taken(cov)) == {0, 1}  # each walk took the counts it planned


def _drive(ls: Lockstep, names: list[str]) -> None:
    """Act each named action (the first enabled instance), completing the device after each."""
    for name in names:
        ls.act(ls.enabled(name)[0])
        while ls.device_ready(0) or ls.device_ready(1):
            ls.advance_device(0 if ls.device_ready(0) else 1)


DRAFTED = ["allocate", "arrive", "schedule", "combine", "launch", "schedule", "combine",
           "launch"]
"""A prefill, then a step whose row reads its newest token and draft from the device."""


@pytest.mark.parametrize("config", ["eager-2cq", "eager-1cq", "traced"])
def test_device_moves_reveal_the_drafts_data_the_model_says(config: str) -> None:
    # Prompt 5, greedy: the drafter's guess after position 1 is right (its row agrees).
    ls = Lockstep(SPEC, "tt", (5,), config=config, drafter=Drafter(agree=(_row_of(5, 1),)))
    try:
        _drive(ls, DRAFTED[:-1])
        pending = ls.observe()
        assert pending.queue[1].rows[0].spec == 1 and pending.queue[1].rows[0].prev_row == 0
        ls.act(ls.enabled("launch")[0])
        assert ls.enabled("launch") == [] and ls.moves[-1].action.args == (1, 1)  # a = 1
        parts_before = len(seen_in(ls.runner.abstract(), ls.observer.observed).parts)
        while ls.device_ready(0):
            ls.advance_device(0)  # each move checks each part as it comes into being
        seen = seen_in(ls.runner.abstract(), ls.observer.observed)
        assert len(seen.parts) > parts_before
        view = ls.observe()
        row = view.queue[1].rows[0]
        assert (row.pos, row.placed, row.consumed, row.drafts) == (1, 1, (0, 1), ((0, 2),))
        assert view.queue[1].accepted == (1,)
        slot = view.slots[1].rows[0]
        # Accepted the draft: two tokens, the newest at 3, and the drafter's guess after it.
        assert (slot.yielded, slot.position, slot.run, slot.drafts) == (2, 3, ((0, 2), (0, 3)),
                                                                         ((0, 4),))
        assert view.slots[1].content == ((0, 3),)
    finally:
        ls.close()


def _row_of(prompt: int, pos: int) -> int:
    """The drafter table's row x = token + pos for greedy request 0 from `prompt`."""
    tokens = patterns.sequences(patterns.probe_for("greedy", 0), (prompt,), pos + 1)[0]
    return tokens[pos] + pos


CORRUPT = [
    # (observed part, the field the check names)
    ("lane1", "rows[0].drafts (device data)"),
    ("base", "rows[0].placed (device data)"),
    ("count", "rows[0].yielded (device data)"),
    ("position", "rows[0].position (device data)"),
    ("tokens0", "rows[0].run (device data)"),
    ("drafts0", "rows[0].drafts (device data)"),
]


@pytest.mark.parametrize(("part", "named"), CORRUPT, ids=[p for p, _ in CORRUPT])
@pytest.mark.parametrize("backend", ["tt", "cpu"])
def test_each_check_fails_on_corrupted_device_data(part: str, named: str, backend: str) -> None:
    ls = Lockstep(SPEC, backend, (5,), drafter=Drafter(agree=(_row_of(5, 1),)))
    try:
        _drive(ls, DRAFTED)
        ls.check(len(ls.moves))  # as it is, it conforms
        observed = ls.observer.observed
        step = ls.runner.queue[1].index
        if part in ("lane1", "base"):
            ids = observed.lanes[step][part]
            observed.lanes[step][part] = (ids[0] + 1, *ids[1:])
        else:
            slot = ls.runner.queue[1].slot
            writer, ids = observed.parts[slot][part]
            observed.parts[slot][part] = (writer, (ids[0] + 1, *ids[1:]))
        with pytest.raises(Divergence, match=re.escape(named)):
            ls.check(len(ls.moves))
    finally:
        ls.close()


def test_a_launch_the_drafter_does_not_accept_is_not_offered(tmp_path: Path) -> None:
    ls = Lockstep(SPEC, "cpu", (5,), drafter=Drafter(agree=()))  # every guess wrong
    try:
        _drive(ls, DRAFTED[:-1])
        model = [a for a, _ in successors(ls.state, ls.bounds) if a.name == "launch"]
        assert {a.args for a in model} == {(1, 0), (1, 1)}  # the model explores both
        assert [a.args for a in ls.enabled("launch")] == [(1, 0)]  # the drafter takes one
        moves = list(ls.moves)
        with pytest.raises(Divergence, match="harness"):
            ls.act(Action("launch", (1, 1)))
    finally:
        ls.close()
    out = replay(SPEC, "cpu", (5,), [*moves, Move("act", Action("launch", (1, 1)))],
                 drafter=Drafter(agree=()))
    assert out.status == INVALID and "drafter" in (out.reason or "")


def test_replay_runs_a_spec_regression_trace(capsys: pytest.CaptureFixture[str]) -> None:
    trace = REGRESSIONS / "positions-advance-by-spec.itf.json"
    assert main(["replay", str(trace)]) == 0  # its drafter comes from the trace
    assert main(["replay", str(trace), "--bug", "positions-advance-by-spec"]) == 1
    assert "(device data)" in capsys.readouterr().out


def test_a_spec_run_trace_writes_reads_and_replays(tmp_path: Path) -> None:
    drafter = Drafter(agree=(_row_of(5, 1),))
    ls = Lockstep(SPEC, "tt", (5,), drafter=drafter, sampling="greedy")
    try:
        _drive(ls, DRAFTED)
        moves, states = list(ls.moves), list(ls.states)
    finally:
        ls.close()
    path = itf.write(tmp_path / "spec.itf.json", itf.to_itf(SPEC, "tt", (5,), moves, states,
                                                            drafter=drafter))
    loaded = itf.load(path)
    assert loaded.drafter == drafter and loaded.bounds == SPEC
    assert any(m.action.name == "launch" and m.action.args == (1, 1) for m in loaded.moves)
    out = replay(loaded.bounds, loaded.backend, loaded.prompts, loaded.moves,
                 loaded.states[1:], config=loaded.config, drafter=loaded.drafter)
    assert out.status == CONFORMS
    # Another drafter does not accept that launch: the trace is no behaviour of that run.
    assert replay(SPEC, "tt", (5,), loaded.moves, drafter=Drafter(agree=())).status == INVALID
    data = json.loads(path.read_text())
    data["#meta"]["ttmirror"]["drafter"] = {"seed": 1}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(itf.TraceError, match="not a drafter"):
        itf.load(tmp_path / "bad.json")
    data = json.loads(path.read_text())
    data["#meta"]["ttmirror"]["version"] = 2  # before the records carried drafts
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(itf.TraceError, match="v2, not 'mirrored-sampled-ids' v3"):
        itf.load(tmp_path / "old.json")


@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_every_edge_of_a_small_spec_bound_is_within_a_drafters_reach(
        policy: str, explored: Explored) -> None:
    ex = explored(SPEC._replace(preempt_policy=policy))
    reqs = patterns.Requirements.of(ex)
    assert reqs.bits == [(0, 1), (0, 2), (0, 3)]
    assert reqs.unreachable(ex.graph.edges()) == []
    # The first edge's need is a pattern that allows that edge.
    first = next(e for e in sorted(ex.graph.edges()) if e in reqs.edge_need)
    pattern = reqs.choose([first])
    assert pattern is not None and reqs.allows(pattern, *first)


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_a_pattern_is_a_drafter_that_guesses_it(sampling: str) -> None:
    bits = [(r, p) for r in range(2) for p in range(1, 5)]
    base = patterns.choose_base(sampling, 2, bits, 0)
    for n in range(0, 256, 37):
        assignment = {bit: bool(n >> i & 1) for i, bit in enumerate(bits)}
        drafter = patterns.drafter_for(sampling, base, 2, assignment)
        ls = Lockstep(SPEC._replace(requests=2), "cpu", prompts_from(base, 2),
                      sampling=sampling, sampling_seed=base, drafter=drafter)
        try:
            assert {bit: ls.context.right(*bit) for bit in bits} == assignment
        finally:
            ls.close()


def test_bits_without_distinct_rows_are_refused_in_one_line() -> None:
    # Two requests at 100 positions each need 200 rows, but token + position stays below 163.
    bits = [(r, p) for r in range(2) for p in range(100)]
    with pytest.raises(patterns.NoDrafter, match="not every pattern"):
        patterns.choose_base("greedy", 2, bits, 0)

"""The state machine in the ci profile, in lockstep with the model, on the emulated TT device in
each configuration and on the cpu backend: it passes, it is not vacuous (every model action ran,
both samplers ran, device effects were compared as they completed), and coverage is recorded
against the exhaustive graph, per configuration."""

from __future__ import annotations

import math

import pytest

from ttmirror.conformance.campaigns import campaign, profiles, walks
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.lockstep.abstraction import PENDING
from ttmirror.conformance.lockstep.harness import Lockstep
from ttmirror.model.explore import Exploration
from ttmirror.model.state import RING, Bounds

RUNS = [("tt", "eager-2cq"), ("tt", "eager-1cq"), ("tt", "traced"), ("cpu", "host")]


@pytest.mark.parametrize(("backend", "config"), RUNS)
def test_state_machine_conforms_in_ci_profile(backend: str, config: str,
                                              default_run: Exploration) -> None:
    cov = Coverage(default_run)
    samplers: set[str] = set()
    compared: list[int] = []  # per run: combine outputs and slot contents compared

    def record(ls: Lockstep) -> None:
        cov.record(ls)
        samplers.add(ls.sampling)
        observer = ls.observer
        if observer is not None:
            compared.append(len(observer.observed.consumed) + len(observer.observed.content))

    result = campaign.run(RING, backend, profiles.profile("ci"), on_run=record,
                          config=config)
    assert not result.failed, result.error
    assert result.config == config and "combine output and slot content" in result.observation
    assert result.examples >= 100 and result.steps > 1000
    assert samplers == {"seeded", "greedy"}
    # Device data really was compared: in most runs, and more than once per run on average.
    assert len(compared) == result.examples
    assert sum(1 for n in compared if n) > result.examples // 2
    assert sum(compared) > result.examples
    assert cov.actions_covered == 1.0, sorted(cov.actions)
    if config not in ("eager-2cq", "host"):
        return  # walks for the default configurations only: CI's time is the limit
    # Uniform rules rarely stop-check a request between its apply and its next schedule; the
    # guided walks target what the rules left uncovered.
    hypothesis_edges = len(cov.edges)
    # A budget in walks, not seconds: what they cover must not depend on the machine's speed.
    walked = walks.run(cov, backend, seed=0, until=1.0, seconds=math.inf, config=config,
                       max_walks=8)
    assert walked.failure is None and walked.walks == 8 and walked.stopped == "walks"
    assert hypothesis_edges < len(cov.edges) < cov.total_edges


def test_the_longer_bound_conforms_and_reaches_a_row_two_steps_back() -> None:
    # With three tokens per request, a request can sit in three consecutive steps and move rows
    # between the first two: there the row it had two steps back (what a map built from the last
    # applied step takes) and the previous step's row differ.
    reached = [0]

    def record(ls: Lockstep) -> None:
        layouts = ls.context.layouts
        for n in layouts:
            if n - 1 in layouts and n - 2 in layouts:
                rows = [{req: i for i, (req, _) in enumerate(layouts[k])} for k in (n - 2, n - 1)]
                if any(r in rows[0] and r in rows[1] and rows[0][r] != rows[1][r]
                       for r, _ in layouts[n]):
                    reached[0] += 1
                    return

    result = campaign.run(RING._replace(max_tokens=3), "tt", profiles.profile("ci"), on_run=record)
    assert not result.failed, result.error
    assert reached[0] > 0


@pytest.mark.parametrize("config", ["eager-2cq", "eager-1cq", "traced"])
def test_device_moves_reveal_the_data_the_model_says(config: str) -> None:
    ls = Lockstep(RING, "tt", (5, 22), config=config)
    try:
        for a in [("allocate", ()), ("arrive", (0,)), ("schedule", (0,)), ("combine", (0,)),
                  ("launch", (0,))]:
            ls.act(next(x for x in ls.enabled(a[0]) if x.args == a[1]))
        assert ls.device_ready(0)
        before = ls.observe()
        # Issued, not computed: the combine's output and the slot are not there yet.
        assert before.queue[0].rows[0].consumed is None and before.slots[0][0] == PENDING
        while ls.device_ready(0):
            ls.advance_device(0)  # each move checks the data against the model
        after = ls.observe()
        assert after.queue[0].rows[0].consumed == (0, 0)  # the row consumed the prompt id
        assert after.slots[0][0] == ((0, 1),)  # the sampler wrote the request's next token
        assert ls.observation.startswith("device data")
    finally:
        ls.close()


def test_refusals_cover_disabled_actions() -> None:
    ls = Lockstep(RING, "cpu")
    try:
        names = {a.name for a in ls.refusable()}
        assert {"arrive", "schedule", "combine", "apply", "release"} <= names
        ls.act(ls.enabled("allocate")[0])  # every refusable action is tried after each act
        assert not ls.failure
    finally:
        ls.close()


def test_profiles_exist() -> None:
    assert profiles.profile("ci").derandomize
    assert profiles.profile("dev").max_examples < profiles.profile("nightly").max_examples
    with pytest.raises(ValueError, match="unknown profile"):
        profiles.profile("weekly")


OPTIONS = [
    # (bounds, the runner counter that shows the option's situation really occurred)
    (RING._replace(preempt_policy="drop"), "dropped_rows"),
    (RING, "preempted_delivered"),  # keep, the default: a preempted token delivered
    (RING._replace(prefill_chunks=2), "partial_rows"),
    (RING._replace(host_sync=True), "host_sync_held"),
]


@pytest.mark.parametrize(("bounds", "stat"), OPTIONS,
                         ids=["preempt-drop", "preempt-keep", "prefill-chunks-2", "host-sync"])
def test_each_option_conforms_and_its_situation_occurs(bounds: Bounds, stat: str) -> None:
    seen = [0]

    def record(ls: Lockstep) -> None:
        seen[0] += ls.runner.stats[stat]

    result = campaign.run(bounds, "tt", profiles.profile("ci"), on_run=record, max_examples=60)
    assert not result.failed, result.error
    assert seen[0] > 0, f"no run had {stat}: the option's situation never occurred"

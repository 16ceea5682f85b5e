"""The serving half of the kill matrix: the logprob ring's data checked, and its bug killed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ttmirror.cli import main
from ttmirror.conformance import bugs
from ttmirror.conformance.kills import matrix as mutants
from ttmirror.conformance.kills import serving_half as serving
from ttmirror.impl.backend import TokenLogprobs
from ttmirror.serving.models import ProbeDecoder


@pytest.mark.parametrize("config", serving.CONFIGS)
def test_the_logprob_ring_carries_the_models_logprobs_in_every_configuration(config: str) -> None:
    verdict = serving.check(config)
    assert verdict.layer is None, verdict.message


def test_the_logprob_check_sees_a_logprob_of_the_wrong_token() -> None:
    # Twin of the data check: the same outcome with one request's logprobs shifted by a token
    # (what a ring read a step late would deliver) and with one top entry's id changed.
    model = ProbeDecoder()
    plan = serving.logprob_plan(model.vocab)
    out = serving.serve("eager-2cq", 2, plan, model)
    assert serving.logprob_errors(out, plan, model) == []
    req = max(out.logprobs, key=lambda r: len(out.logprobs[r]))
    lps = out.logprobs[req]
    late = replace(out, logprobs={**out.logprobs, req: [lps[0], *lps[:-1]]})
    assert any("the model gives" in e for e in serving.logprob_errors(late, plan, model))
    first = lps[0]
    swapped = TokenLogprobs(first.sampled, ((first.top[0][0] ^ 1, first.top[0][1]),
                                            *first.top[1:]))
    bad = replace(out, logprobs={**out.logprobs, req: [swapped, *lps[1:]]})
    assert any("top entries" in e for e in serving.logprob_errors(bad, plan, model))


@pytest.mark.parametrize("config", serving.CONFIGS)
def test_logprobs_copied_after_the_event_are_killed_as_a_hazard(config: str) -> None:
    killed, verdict = serving.kill("logprobs-after-event", config)
    assert killed and verdict.layer == "hazard", verdict
    assert "unsynchronised-readback" in (verdict.message or "")


def test_mutants_lists_the_serving_bugs_beside_the_lockstep_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(bugs.SERVING_BUGS).isdisjoint(bugs.BUGS)
    code = main(["mutants", "--bug", "logprobs-after-event", "--json"])
    kills = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(k["id"], k["config"], k["killed"], k["layer"], k["by"]) for k in kills] == [
        ("logprobs-after-event", c, True, "hazard", "serving") for c in serving.CONFIGS
    ]
    assert all(k["layer"] in mutants.LAYERS for k in kills)


@pytest.mark.parametrize("config", serving.CONFIGS)
def test_a_livelock_stops_the_engine_in_a_few_iterations_naming_the_stuck_requests(
        config: str) -> None:
    """The planted `last-chunk-stays-partial` keeps each request's last prefill chunk partial
    forever: nothing moves while work remains. The engine says so itself (`NoProgress`) within
    `STALL_LIMIT` iterations, in one line naming the stuck requests and how far their prefill
    got, not at the loop's iteration cap; without the bug the same workload serves (above)."""
    from ttmirror.serving.engine import STALL_LIMIT

    killed, verdict = serving.kill("last-chunk-stays-partial", config)
    assert killed and verdict.layer == "no progress", verdict
    message = verdict.message or ""
    assert message.startswith(f"the engine made no progress in {STALL_LIMIT} iterations in a row")
    assert "r0 RUNNING 0/" in message and "prefill 2/2 context tokens" in message
    assert "not ended" in message and "\n" not in message


def test_mutants_lists_the_livelock_killed_by_the_serving_half(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["mutants", "--bug", "last-chunk-stays-partial", "--json"])
    kills = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(k["id"], k["config"], k["killed"], k["layer"], k["by"]) for k in kills] == [
        ("last-chunk-stays-partial", c, True, "no progress", "serving") for c in serving.CONFIGS
    ]

"""`ScheduledEngine` refuses a foreign plan the model does not allow, in one line, and serves
one it does."""

from __future__ import annotations

import pytest

from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig
from ttmirror.serving.models import ProbeDecoder
from ttmirror.serving.scheduled import Disagreement, NewRequest, Plan, ScheduledEngine


def _engine() -> ScheduledEngine:
    return ScheduledEngine(ServingBackend(CpuBackend(), ProbeDecoder()),
                           ServingConfig(async_scheduling="off", rows=4))


def _two_arrive(engine: ScheduledEngine) -> None:
    engine.launch(Plan(rows=(0, 1), tokens={0: 3, 1: 2}, computed={0: 0, 1: 0},
                       new=(NewRequest(0, (1, 2, 3), 4), NewRequest(1, (4, 5), 4))))
    got = engine.collect()
    assert set(got.tokens) == {0, 1} and all(len(t) == 1 for t in got.tokens.values())


def test_a_plan_the_model_allows_is_served() -> None:
    engine = _engine()
    _two_arrive(engine)
    engine.launch(Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3, 1: 2}))
    assert {k: len(v) for k, v in engine.collect().tokens.items()} == {0: 1, 1: 1}


@pytest.mark.parametrize(("plan", "why"), [
    (Plan(rows=(0,), tokens={0: 1}, computed={0: 3}), "the model's step holds every eligible"),
    (Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 4, 1: 2}), "the plan says 4 tokens"),
    (Plan(rows=(0, 1), tokens={0: 2, 1: 1}, computed={0: 3, 1: 2}), "decodes 2 tokens"),
    (Plan(rows=(0, 1), tokens={0: 1, 1: 1}, computed={0: 3, 1: 2}, spec={0: (-1,)}),
     "carries 0 draft(s)"),
])
def test_a_plan_the_model_forbids_is_refused(plan: Plan, why: str) -> None:
    engine = _engine()
    _two_arrive(engine)
    with pytest.raises(Disagreement, match=why.replace("(", r"\(").replace(")", r"\)")):
        engine.launch(plan)

"""The Hypothesis state machine: the model's actions, device progress and request events as rules.

Each model action is one rule whose precondition is the model's enabledness (some instance of it
is enabled); the rule draws one enabled instance (a queue position, a request, a slot, a row
order) and performs it in lockstep (`Lockstep.act`), which checks the abstraction, the model's
invariants and that every model-disabled action is refused. Two more rules complete the next
command on CQ0 or CQ1 of the emulated device. Load (allocate) runs in the initialize step.
Hypothesis' swarm testing switches rules off per example, and rule weights (`RULE_WEIGHTS`) make
the events that close or set back a request rarer: together they reach the deep states (a
resumed request decoding from host ids needs some fifteen moves without an abort in between).

`machine(bounds, backend)` builds the class; `Recorder` keeps what the runs did, so a failure
becomes an ITF trace: Hypothesis replays the shrunk example last, so the last failing run recorded
is the minimal one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis import target
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ttmirror.conformance.lockstep.harness import (
    SAMPLERS,
    Divergence,
    Lockstep,
    Move,
    prompts_from,
)
from ttmirror.conformance.traces.moves import Drafter
from ttmirror.model.actions import actions_of
from ttmirror.model.state import Bounds

type EdgeSink = Callable[[Lockstep], None]


class OutOfTime(BaseException):
    """The campaign's deadline passed: raised between moves to end Hypothesis' generation or
    shrinking at once. A BaseException, so Hypothesis does not take it for a test failure."""


@dataclass
class FailedRun:
    moves: list[Move]
    states: list[Any]
    prompts: tuple[int, ...]
    error: Any
    sampling: str = "greedy"
    sampling_seed: int = 0
    drafter: Drafter | None = None


@dataclass
class Recorder:
    """Shared by every example of one campaign."""

    start: float = field(default_factory=time.perf_counter)
    examples: int = 0
    steps: int = 0
    first_failure_examples: int | None = None
    first_failure_seconds: float | None = None
    last_failure: FailedRun | None = None
    """The last failing run: the shrunk one once Hypothesis has finished."""
    smallest_failure: FailedRun | None = None
    """The failing run that failed in the fewest moves: what a run cut short reports."""
    on_run: EdgeSink | None = None
    """Called with every finished run (coverage accounting)."""
    observation: str = ""
    """What the abstraction could see (device data, or host state only on a chip)."""
    deadline: float | None = None
    """`time.perf_counter()` past which the campaign stops (`OutOfTime`); None = no limit."""
    expired: bool = False
    """The deadline passed and a move saw it: whatever Hypothesis raises after that (it may take
    the interruption for inconsistent data generation) is the cut's doing."""

    def check_time(self) -> None:
        """Raise `OutOfTime` once the deadline has passed."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.expired = True
            raise OutOfTime

    def finished(self, ls: Lockstep) -> None:
        self.steps += len(ls.moves)
        self.observation = ls.observation
        if self.on_run is not None:
            self.on_run(ls)
        if ls.failure is None:
            return
        if self.first_failure_examples is None:
            self.first_failure_examples = self.examples
            self.first_failure_seconds = time.perf_counter() - self.start
        # A copy, not the divergence itself: that one is still propagating to Hypothesis, which
        # needs its traceback to tell this failure's origin and shrink it; the copy holds no frames.
        failure = ls.failure
        kept = Divergence(failure.kind, failure.message, failure.step)
        self.last_failure = FailedRun(list(ls.moves), list(ls.states), ls.prompts, kept,
                                      ls.sampling, ls.sampling_seed, ls.drafter)
        smallest = self.smallest_failure
        if smallest is None or kept.step <= smallest.error.step:
            self.smallest_failure = self.last_failure


RULE_WEIGHTS: dict[str, float] = {"abort": 0.2, "finish": 0.5, "preempt": 0.8}
"""Chance that a selected rule acts: events that close or set back a request would otherwise
end most examples within a few steps, long before a request decodes from the mirror."""


def _action_rule(name: str) -> Any:
    weight = RULE_WEIGHTS.get(name)

    def perform(self: Any, data: st.DataObject, chance: int = 0) -> None:
        if weight is not None and chance >= 100 * weight:
            return  # 0 (act) is what shrinking moves toward
        action = data.draw(st.sampled_from(self.ls.enabled(name)), label=name)
        self.ls.act(action)

    # Named before decorating: swarm testing switches rules on and off by name.
    perform.__name__ = perform.__qualname__ = name
    enabled = precondition(lambda self: self.ls is not None and bool(self.ls.enabled(name)))
    if weight is None:
        return enabled(rule(data=st.data())(perform))
    # A second argument also sorts the rule after the one-argument rules (Hypothesis orders rules
    # by arity, then name), so the simplest examples make progress before they close a request.
    # sampled_from draws uniformly while generating (integers favour small and edge values).
    return enabled(rule(data=st.data(), chance=st.sampled_from(range(100)))(perform))


def _any_action_rule() -> Any:
    def any_action(self: Any, data: st.DataObject, chance: int = 0) -> None:
        """Some enabled model action, the rare ones (`RULE_WEIGHTS`) at their weight: the rule
        swarm testing cannot starve of progress by switching one action's rule off."""
        actions = [
            a for a in self.ls.enabled()
            if chance < 100 * RULE_WEIGHTS.get(a.name, 1.0)
        ]
        if actions:
            self.ls.act(data.draw(st.sampled_from(actions), label="any_action"))

    enabled = precondition(lambda self: self.ls is not None and bool(self.ls.enabled()))
    return enabled(rule(data=st.data(), chance=st.sampled_from(range(100)))(any_action))


def _device_rule(cq: int) -> Any:
    def complete(self: Any) -> None:
        self.ls.advance_device(cq)

    complete.__name__ = complete.__qualname__ = f"device_step_cq{cq}"
    ready = precondition(lambda self: self.ls is not None and self.ls.device_ready(cq))
    return ready(rule()(complete))


def _effect_rule(cq: int) -> Any:
    def complete(self: Any) -> None:
        self.ls.advance_to_effect(cq)

    complete.__name__ = complete.__qualname__ = f"device_effect_cq{cq}"
    ready = precondition(lambda self: self.ls is not None and self.ls.effect_ready(cq))
    return ready(rule()(complete))


def richness(ls: Lockstep) -> float:
    """How much of the model one example exercised: distinct actions, tokens, resumptions."""
    kinds = {m.action.name for m in ls.moves if m.kind == "act"}
    tokens = sum(len(r.delivered) for r in ls.state.requests)
    resumed = sum(r.preemptions for r in ls.state.requests if r.delivered)
    return float(len(kinds) + tokens + 2 * resumed)


def machine(bounds: Bounds, backend: str, recorder: Recorder, config: str | None = None,
            bug: str | None = None) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class for these bounds, backend and configuration, with `bug`
    planted in the implementation, reporting to `recorder`."""

    class Conformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            recorder.examples += 1
            self.ls: Lockstep | None = None  # opened by the initialize rule, which runs first

        def start(self, base: int, sampling: str, drafter: Drafter | None) -> None:
            # Distinct prompts per request, and the sampler (seeded first: the simplest examples
            # then test the draw's keying too); drawn, so a failure's trace says which.
            self.ls = Lockstep(bounds, backend, prompts_from(base, bounds.requests),
                               config=config, sampling=sampling, sampling_seed=base, bug=bug,
                               drafter=drafter)
            # Load allocates the ring before anything else can happen; as a rule, swarm testing
            # would switch it off in a share of the examples, which then do nothing at all.
            self.ls.act(self.ls.enabled("allocate")[0])

        if bounds.spec_tokens:
            # With drafts the drafter is drawn too (its seeded share of right guesses): which
            # launches an example can take follow from it. Without, nothing more is drawn, so
            # examples without drafts are as they always were.
            @initialize(base=st.integers(0, 63), sampling=st.sampled_from(SAMPLERS),
                        drafter=st.integers(0, 255))
            def prompts(self, base: int, sampling: str, drafter: int) -> None:
                self.start(base, sampling, Drafter(seed=drafter, agreement=0.5))
        else:
            @initialize(base=st.integers(0, 63), sampling=st.sampled_from(SAMPLERS))
            def prompts(self, base: int, sampling: str) -> None:
                self.start(base, sampling, None)

        def teardown(self) -> None:
            if self.ls is None:
                return
            # Targeting: steer generation toward rich examples (many kinds of action, tokens
            # delivered, requests back from preemption), where the deep bugs live.
            target(richness(self.ls), label="richness")
            try:
                self.ls.close()
            finally:
                recorder.finished(self.ls)

    def stuck(self: Any) -> bool:
        return self.ls is not None and not self.ls.enabled() and not any(
            self.ls.device_ready(cq) for cq in (0, 1))

    @invariant()
    def within_time(self: Any) -> None:
        """The campaign's deadline: checked after every move, shrinking included."""
        recorder.check_time()

    @precondition(stuck)
    @invariant()
    def settled(self: Any) -> None:
        """Nothing is enabled (every request closed): conformance still holds, nothing moves."""
        assert self.ls is not None
        self.ls.check(len(self.ls.moves))

    @precondition(stuck)
    @rule()
    def idle(self: Any) -> None:
        """With nothing enabled, every action must still be refused (and the example goes on)."""
        assert self.ls is not None
        for disabled in self.ls.refusable():
            self.ls.refuse(disabled, record=False)

    Conformance.within_time = within_time  # type: ignore[attr-defined]
    Conformance.settled = settled  # type: ignore[attr-defined]
    Conformance.idle = idle  # type: ignore[attr-defined]
    for name in actions_of(bounds):
        setattr(Conformance, name, _action_rule(name))
    Conformance.any_action = _any_action_rule()  # type: ignore[attr-defined]
    for cq in (0, 1):
        setattr(Conformance, f"device_step_cq{cq}", _device_rule(cq))
        setattr(Conformance, f"device_effect_cq{cq}", _effect_rule(cq))
    Conformance.__name__ = Conformance.__qualname__ = f"Conformance_{backend}"
    return Conformance

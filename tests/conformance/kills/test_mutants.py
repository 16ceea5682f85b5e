"""Every planted bug is killed in every configuration where it can occur, by the check the kill
matrix names; its shrunk regression trace fails with the bug, conforms without it, and (for the
device half) fails the moment the wrong data exists on the device."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ttmirror.conformance import bugs
from ttmirror.conformance.campaigns import profiles
from ttmirror.conformance.kills import matrix as mutants
from ttmirror.conformance.lockstep import abstraction, planted
from ttmirror.conformance.lockstep.harness import Divergence, Lockstep
from ttmirror.conformance.lockstep.replay import CONFORMS, FAILS, replay
from ttmirror.conformance.traces import itf
from ttmirror.conformance.traces.configs import CONFIGS
from ttmirror.emulator import ProcessScheduler
from ttmirror.impl.overrides import NONE
from ttmirror.model.explore import Exploration
from ttmirror.model.state import RING
from ttmirror.resources import REGRESSIONS

DATA_BUGS = sorted(mutants.DEVICE_HALF - {"stage-cq1-no-event"})
"""Device-half bugs that change what the device computes (the other one is a race)."""
KILLS = [
    (backend, config, bug)
    for backend in ("tt", "cpu")
    for config in CONFIGS[backend]
    for bug in sorted(bugs.BUGS)
    if mutants.applies(bug, backend, config)
]


def _replay(trace: itf.Loaded, moves: list | None = None,  # type: ignore[type-arg]
            bug: str | None = None) -> str:
    return replay(trace.bounds, trace.backend, trace.prompts,
                  trace.moves if moves is None else moves, config=trace.config,
                  sampling=trace.sampling, sampling_seed=trace.sampling_seed, bug=bug,
                  drafter=trace.drafter).status


def test_catalog_has_every_bug_class_and_a_trace_each() -> None:
    assert len(bugs.BUGS) >= 20 and len(mutants.DEVICE_HALF) >= 8
    assert {p.name.removesuffix(".itf.json") for p in REGRESSIONS.glob("*.itf.json")} == set(
        bugs.BUGS
    )


@pytest.mark.parametrize("bug", sorted(bugs.BUGS))
def test_regression_trace_fails_with_its_bug_and_passes_without(bug: str) -> None:
    trace = itf.load(REGRESSIONS / f"{bug}.itf.json")
    assert trace.meta["bug"] == bug
    on = replay(trace.bounds, trace.backend, trace.prompts, trace.moves, trace.states[1:],
                config=trace.config, sampling=trace.sampling, sampling_seed=trace.sampling_seed,
                bug=bug, drafter=trace.drafter)
    off = replay(trace.bounds, trace.backend, trace.prompts, trace.moves, trace.states[1:],
                 config=trace.config, sampling=trace.sampling, sampling_seed=trace.sampling_seed,
                 drafter=trace.drafter)
    assert on.status == FAILS, on.reason
    assert off.status == CONFORMS, off.replayed[-1:]


def _effects(trace: itf.Loaded, moves: list,  # type: ignore[type-arg]
             bug: str) -> set[tuple[object, ...]]:
    """The device effects (combine outputs, sampler writes, by step; with drafts each part of
    them, with what it holds) that came into being during `moves`, `bug` planted (a slot's
    content is overwritten later, so it is collected move by move)."""
    ls = Lockstep(trace.bounds, trace.backend, trace.prompts, config=trace.config,
                  sampling=trace.sampling, sampling_seed=trace.sampling_seed, bug=bug,
                  drafter=trace.drafter)
    effects: set[tuple[object, ...]] = set()
    try:
        for move in moves:
            diverged = False
            try:
                ls.perform(move)
            except Divergence:
                diverged = True  # the effect exists all the same: collect it, then stop
            if ls.observer is not None:  # it exists once the ring is allocated
                seen = ls.observer.observed
                effects |= {("combine", n) for n in seen.consumed}
                effects |= {("sampler", n) for n, _ in seen.content.values()}
                effects |= {("combine", n, part, ids) for n, parts in seen.lanes.items()
                            for part, ids in parts.items()}
                effects |= {("slot", k, part, n, ids) for k, parts in seen.parts.items()
                            for part, (n, ids) in parts.items()}
            if diverged:
                break
        return effects
    finally:
        ls.close()


@pytest.mark.parametrize("bug", DATA_BUGS)
def test_device_half_traces_fail_when_the_wrong_data_comes_into_being(bug: str) -> None:
    trace = itf.load(REGRESSIONS / f"{bug}.itf.json")
    failure = trace.meta["failure"]
    # Device data differs (a host-blocking move may complete the effect and its readback at
    # once: then the host copy differs beside it).
    assert "(device data)" in failure["message"]
    assert failure["step"] == len(trace.moves)
    assert _replay(trace, bug=bug) == FAILS
    # Nothing showed before that move...
    assert _replay(trace, trace.moves[:-1], bug=bug) == CONFORMS
    # ... and the failing move is the one in which the wrong data came into being: a combine
    # output or a sampler write that did not exist before it (not a later read).
    assert _effects(trace, trace.moves, bug) > _effects(trace, trace.moves[:-1], bug)


@pytest.mark.parametrize(("backend", "config", "bug"), KILLS)
def test_suite_kills_bug_in_every_configuration(backend: str, config: str, bug: str,
                                                default_run: Exploration, tmp_path: Path) -> None:
    default = (backend, config) == ("tt", CONFIGS["tt"][0])
    bounds = mutants.bounds_for(bug, RING)
    explored = (lambda: default_run) if bounds == RING else None
    # The walks stop at the first kill, or when every edge is walked: no clock decides the
    # verdict (alone, the slowest cell takes about 45 s of walking).
    kill = mutants.kill(bug, bounds, backend, profiles.profile("ci"), walk_seconds=math.inf,
                        trace_dir=tmp_path, explored=explored, config=config,
                        shrinking=default)
    assert kill.killed and kill.harness_error is None, kill
    assert kill.layer in mutants.LAYERS and kill.examples is not None
    if bug in DATA_BUGS:
        assert kill.layer == "device data", kill
    assert kill.trace is not None
    if default:
        assert kill.trace_len is not None and kill.trace_len <= 40
    loaded = itf.load(Path(kill.trace))
    assert loaded.config == config
    assert _replay(loaded, bug=bug) == FAILS


def test_a_harness_error_is_not_a_kill(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(*args: object) -> object:
        raise KeyError("the harness's own bug")

    monkeypatch.setattr("ttmirror.conformance.lockstep.harness.abstract", broken)
    kill = mutants.kill("where-swapped", RING, "tt", profiles.profile("ci"), walk_seconds=1,
                        trace_dir=tmp_path, shrinking=False)
    assert not kill.killed and kill.layer is None
    assert kill.harness_error is not None and "the harness's own bug" in kill.harness_error


def test_layers_name_the_check() -> None:
    assert mutants.layer("state", "queue[0].rows[1].consumed (device data): ...") == "device data"
    assert mutants.layer("state", "requests[0].delivered: ...") == "host state"
    assert mutants.layer("accepted", "...") == "refusal"
    assert mutants.layer("hazard:read-after-write", "...") == "hazard"
    assert mutants.layer("invariant", "...") == "model invariant"
    assert mutants.layer("harness", "...") is None
    assert abstraction.PENDING == "pending"


def test_a_bug_is_a_value_checked_against_the_catalog() -> None:
    assert bugs.check(["guard-off", None]) == frozenset({"guard-off"})
    assert bugs.check() == frozenset()
    assert planted.overrides(["guard-off", None]) == (planted.GuardOff,)
    assert planted.overrides() == NONE == ()
    with pytest.raises(ValueError, match="unknown planted bug 'no-such-bug'"):
        bugs.check(["no-such-bug"])
    with pytest.raises(ValueError, match="unknown planted bug 'no-such-bug'"):
        planted.overrides(["no-such-bug"])


def test_every_bug_of_the_catalog_is_planted_by_overrides_of_impl_classes() -> None:
    # Each bug has its overrides, each a direct subclass of one class of impl/ that redefines
    # methods that class has (a decision it makes), and nothing of impl/ names a bug.
    assert set(planted.PLANTED) == set(bugs.ALL)
    for bug, classes in planted.PLANTED.items():
        for cls in classes:
            (base,) = cls.__bases__
            assert base.__module__.startswith("ttmirror.impl."), (bug, cls)
            own = {n for n, v in vars(cls).items() if callable(v) and n != "__init__"}
            assert own and own <= set(dir(base)), (bug, cls, own - set(dir(base)))
    for path in (Path(__file__).resolve().parents[3] / "src" / "ttmirror" / "impl").glob("*.py"):
        text = path.read_text()
        assert "_planted(" not in text and not any(f'"{b}"' in text for b in bugs.ALL), path


TT_TRACES = sorted(bug for bug in bugs.BUGS
                   if itf.load(REGRESSIONS / f"{bug}.itf.json").backend == "tt")


@pytest.mark.parametrize("bug", TT_TRACES)
def test_regression_trace_gives_its_verdict_with_the_device_in_a_process(bug: str) -> None:
    """The lockstep's device moves across the boundary (`Emulator(process=True)`: each move one
    command run in the device process, the observer reading its shared DRAM): every TT
    regression trace fails as it does in the host's process, at the same move with the same
    divergence, and conforms without its bug."""
    trace = itf.load(REGRESSIONS / f"{bug}.itf.json")
    runs = [replay(trace.bounds, trace.backend, trace.prompts, trace.moves, config=trace.config,
                   sampling=trace.sampling, sampling_seed=trace.sampling_seed, bug=b,
                   drafter=trace.drafter, device_process=process)
            for b, process in ((bug, False), (bug, True), (None, True))]
    here, there, clean = runs
    assert there.status == FAILS and here.status == FAILS
    assert there.divergence is not None and here.divergence is not None
    assert (there.divergence.kind, there.divergence.message, len(there.replayed)) == (
        here.divergence.kind, here.divergence.message, len(here.replayed))
    assert clean.status == CONFORMS, clean.replayed[-1:]


def test_the_traces_replayed_in_a_device_process_move_it_and_it_is_one() -> None:
    """Not vacuous: the lockstep's device is a gated device process, and the traces above
    include device moves (each one command run there), not only host-blocking calls."""
    moved = [bug for bug in TT_TRACES if any(
        m.kind == "device" for m in itf.load(REGRESSIONS / f"{bug}.itf.json").moves)]
    assert len(moved) >= 10, moved
    trace = itf.load(REGRESSIONS / f"{moved[0]}.itf.json")
    ls = Lockstep(trace.bounds, "tt", trace.prompts, config=trace.config, device_process=True)
    try:
        ls.act(ls.enabled("allocate")[0])
        scheduler = ls.device.scheduler
        assert isinstance(scheduler, ProcessScheduler) and scheduler.policy is not None
        assert scheduler._process.is_alive() and ls.device.executor is scheduler
    finally:
        ls.close()

"""The kill matrix: run the suite against every planted bug and report how each was found.

Per bug and configuration: first the Hypothesis state machine (the given profile, shrinking left
to us), then, if it survived, walks guided toward uncovered edges of the graph. The first failing
run is shrunk by deterministic replay (`replay.shrink`) and written as an ITF trace.

A kill says which check found the bug (`layer`): device data (the combine's output or a slot's
content, or device effects out of order), host state (the runner's books), refusal (an action
accepted or refused against the model), hazard (the emulated device's race and lifetime checks),
model invariant, no progress (the serving loop's livelock check, `serving.engine.NoProgress`), or
crash (the implementation raised). An exception of the harness itself is a
harness error, never a kill.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import Phase, settings

from ttmirror.conformance import bugs as catalog
from ttmirror.conformance.campaigns import campaign, walks
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.lockstep.replay import FAILS, replay, shrink
from ttmirror.conformance.traces import itf
from ttmirror.conformance.traces.configs import CONFIGS
from ttmirror.conformance.traces.moves import Move
from ttmirror.model.actions import take
from ttmirror.model.explore import Exploration, explore
from ttmirror.model.state import Bounds, State, initial_state

DEVICE_HALF = frozenset(
    {
        "where-swapped", "mask-inverted", "gather-off-by-one", "gather-current-slot",
        "positions-stale", "stage-cq1-no-event", "sampler-keyed-by-row", "sampler-keyed-by-step",
        "positions-advance-by-spec", "bonus-token-dropped", "rejected-draft-delivered",
        "host-drafts-placeholder", "draft-count-of-another-row",
    }
)
"""Bugs in what the device computes (the combine's ops and inputs, the launch's verification),
not the runner's books."""
SPEC_BOUND: dict[str, int | bool | str] = {"requests": 1, "max_tokens": 3, "spec_tokens": 1}
"""The bound of the spec-decode bugs: one request of three tokens with one draft per decoding
row, so that a drafted step is verified (both ways), its position read by the next, a resumed
request re-enters past its prompt, and a host row carries drafts read back (1,602 states)."""
NEEDS_BOUNDS: dict[str, dict[str, int | bool | str]] = {
    "prev-row-two-back": {"max_tokens": 3},
    "partial-prefill-feeds-mirror": {"prefill_chunks": 2},
    "host-sync-unguarded": {"host_sync": True},
    **dict.fromkeys(catalog.SPEC_BUGS, SPEC_BOUND),
    "draft-count-of-another-row": {"subsets": True, "spec_tokens": 1, "max_tokens": 2,
                                   "finish": False, "abort": False, "preempt": False},
    "skipped-from-previous-step": {"subsets": True, "finish": False, "abort": False,
                                   "preempt": False},
    "state-row-reused-in-flight": {"state": "rows", "requests": 1},
    "idx-from-previous-order": {"state": "rows", "finish": False, "abort": False,
                                "preempt": False},
}
"""Bounds a bug needs to occur at all (beyond the defaults): a request must have a row in three
steps for "two back" and "one back" to differ; chunked prefill; a host-sync request; drafts;
vLLM's freedoms (a step that leaves a request out, rows with fewer drafts than another's);
state rows (one request that aborts with its step in flight; two whose rows change places)."""
TWO_QUEUES = frozenset({"readback-cq1-no-wait", "stage-cq1-no-event"})
"""Bugs that need a second command queue: they cannot occur in the one-queue configuration."""


LAYERS = ("device data", "host state", "refusal", "hazard", "model invariant", "no progress",
          "crash")


def layer(kind: str, message: str) -> str | None:
    """Which check a divergence came from; None for the harness's own errors."""
    if kind == "harness":
        return None
    if kind == "device-order" or (kind == "state" and "(device data)" in message):
        return "device data"
    if kind == "state":
        return "host state"
    if kind in ("refused", "accepted", "not-enabled"):
        return "refusal"
    if kind.startswith("hazard"):
        return "hazard"
    if kind == "invariant":
        return "model invariant"
    return "crash"


@dataclass
class Kill:
    id: str
    killed: bool
    by: str | None
    """hypothesis or walk: the engine whose run failed first."""
    config: str
    layer: str | None
    """Which check killed it (`LAYERS`); None if it survived or the harness broke."""
    harness_error: str | None
    """The harness's own exception, when that is what stopped the run (not a kill)."""
    examples: int | None
    """Hypothesis examples, or walks, up to and including the first failure."""
    seconds: float | None
    """Seconds to the first failure."""
    trace_len: int | None
    """Moves in the shrunk trace."""
    failure: str | None = None
    trace: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def kill(bug: str, bounds: Bounds, backend: str, base: settings, *, walk_seconds: float,
         trace_dir: Path | None, explored: Callable[[], Exploration] | None = None,
         seed: int = 0, config: str | None = None, shrinking: bool = True) -> Kill:
    """Find `bug`: Hypothesis first, then guided walks from fresh coverage of `explored`; the
    first failing run is shrunk by replay unless `shrinking` is off."""
    config = config or CONFIGS[backend][0]
    no_shrink = settings(base, phases=[Phase.explicit, Phase.generate, Phase.target])
    result = campaign.run(bounds, backend, no_shrink, bug=bug, config=config)
    moves: list[Move] | None = None
    prompts: tuple[int, ...] = ()
    sampling, sampling_seed = "greedy", 0
    drafter = None
    by, examples, seconds = None, None, None
    if result.failed and result.failing is not None:
        by, examples = "hypothesis", result.first_failure_examples
        seconds = result.first_failure_seconds
        moves, prompts = result.failing.moves, result.failing.prompts
        sampling, sampling_seed = result.failing.sampling, result.failing.sampling_seed
        drafter = result.failing.drafter
        step = getattr(result.failing.error, "step", len(moves) - 1)
        moves = moves[: step + 1]
    else:
        cov = Coverage(explored() if explored is not None else explore(bounds))
        walk_start = time.perf_counter()
        walked = walks.run(cov, backend, seed=seed, until=1.0, seconds=walk_seconds,
                           config=config, bug=bug)
        if walked.failure is not None:
            by, examples = "walk", walked.failure.walk + 1
            seconds = result.seconds + (time.perf_counter() - walk_start)
            moves = walked.failure.moves[: walked.failure.step + 1]
            prompts = walked.failure.prompts
            sampling, sampling_seed = walked.failure.sampling, walked.failure.sampling_seed
            drafter = walked.failure.drafter
    if moves is None:
        return Kill(bug, False, None, config, None, None, None, None, None)

    def fails(candidate: list[Move]) -> bool:
        return replay(bounds, backend, prompts, candidate, config=config, sampling=sampling,
                      sampling_seed=sampling_seed, bug=bug, drafter=drafter).status == FAILS

    small = shrink(list(moves), fails) if shrinking else list(moves)
    outcome = replay(bounds, backend, prompts, small, config=config, sampling=sampling,
                     sampling_seed=sampling_seed, bug=bug, drafter=drafter)
    d = outcome.divergence
    if d is not None and d.kind == "harness":
        return Kill(bug, False, by, config, None, f"{d.message}"[:300], examples, None, None)
    path = None
    if trace_dir is not None and d is not None:
        states = model_states(bounds, small)
        trace = itf.to_itf(bounds, backend, prompts, small, states, failure=d, bug=bug,
                           seed=seed, config=config, sampling=sampling,
                           sampling_seed=sampling_seed, drafter=drafter)
        name = bug if config == CONFIGS[backend][0] else f"{bug}-{config}"
        path = str(itf.write(Path(trace_dir) / f"{name}.itf.json", trace))
    return Kill(bug, outcome.status == FAILS, by, config,
                layer(d.kind, d.message) if d is not None else None, None, examples,
                round(seconds, 3) if seconds is not None else None, len(small),
                None if d is None else f"{d.kind}: {d.message}"[:300], path)


def model_states(bounds: Bounds, moves: list[Move]) -> list[State]:
    """The model state after each move (device moves and refusals leave it as it was)."""
    s, out = initial_state(bounds), []
    for move in moves:
        if move.kind == "act":
            t = take(s, bounds, move.action)
            s = t if t is not None else s
        out.append(s)
    return out


def applies(bug: str, backend: str, config: str) -> bool:
    """Can `bug` occur on `backend` in `config`? (tt-only bugs, two-queue bugs)."""
    if backend != "tt" and bug in catalog.TT_ONLY:
        return False
    return not (config == "eager-1cq" and bug in TWO_QUEUES)


def serving_matrix(bugs: list[str] | None = None,
                   configs: list[str] | None = None) -> list[Kill]:
    """One kill per serving-only bug (`catalog.SERVING_BUGS`) and configuration, found by the
    serving half (`serving.py`: a logprob workload whose ring data is checked)."""
    from ttmirror.conformance.kills import serving_half as serving

    out: list[Kill] = []
    for config in configs or list(serving.CONFIGS):
        for bug in bugs or list(catalog.SERVING_BUGS):
            killed, v = serving.kill(bug, config)
            out.append(Kill(bug, killed, "serving" if killed else None, config, v.layer, None,
                            1 if killed else None, v.seconds if killed else None, None,
                            v.message))
    return out


def fault_matrix(bugs: list[str] | None = None) -> list[Kill]:
    """One kill per fault-handling bug (`catalog.FAULT_HANDLING_BUGS`), found by the fault half
    (`fault_runs.py`: serving runs that meet one device fault each), in eager-2cq."""
    from ttmirror.conformance.kills import fault_half as fault_runs

    out: list[Kill] = []
    for bug in bugs or list(catalog.FAULT_HANDLING_BUGS):
        killed, v = fault_runs.kill(bug)
        out.append(Kill(bug, killed, "faults" if killed else None, "eager-2cq", v.layer, None,
                        1 if killed else None, v.seconds if killed else None, None, v.message))
    return out


def allocator_matrix(bugs: list[str] | None = None) -> list[Kill]:
    """One kill per planted bug of the emulated allocator (`emulator.allocator.PLANTED`), found by
    the allocator half (`allocator_runs.py`: restored copies stepped together)."""
    from ttmirror.conformance.kills import allocator_half as allocator_runs
    from ttmirror.emulator.allocator import PLANTED

    out: list[Kill] = []
    for bug in bugs or list(PLANTED):
        killed, v = allocator_runs.kill(bug)
        out.append(Kill(bug, killed, "allocator" if killed else None, "eager-2cq", v.layer, None,
                        1 if killed else None, v.seconds if killed else None, None, v.message))
    return out


def bounds_for(bug: str, bounds: Bounds) -> Bounds:
    """`bounds`, raised where `bug` needs more to occur at all (`NEEDS_BOUNDS`)."""
    needs: dict[str, Any] = NEEDS_BOUNDS.get(bug, {})
    return bounds._replace(**needs)


def matrix(bounds: Bounds, backend: str, base: settings, *, bugs: list[str] | None = None,
           configs: list[str] | None = None, walk_seconds: float = math.inf,
           trace_dir: Path | None = None, explored: Exploration | None = None) -> list[Kill]:
    """One kill per bug and configuration where it can occur, each at the bounds it needs; each
    bound's graph is explored at most once (and only if Hypothesis misses a bug there)."""
    graphs: dict[Bounds, Callable[[], Exploration]] = {}
    if explored is not None:
        graphs[explored.bounds] = lambda: explored
    out: list[Kill] = []
    for config in configs or [CONFIGS[backend][0]]:
        for bug in bugs or list(catalog.BUGS):
            if not applies(bug, backend, config):
                continue
            b = bounds_for(bug, bounds)
            graph = graphs.setdefault(b, functools.cache(lambda b=b: explore(b)))
            out.append(kill(bug, b, backend, base, walk_seconds=walk_seconds,
                            trace_dir=trace_dir, explored=graph, config=config))
    return out

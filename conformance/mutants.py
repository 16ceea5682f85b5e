"""The kill matrix: run the suite against every planted bug and report how each was found.

Per bug: first the Hypothesis state machine (the given profile, shrinking left to us), then, if
it survived, walks guided toward uncovered edges of the graph. The first failing run is shrunk
by deterministic replay (`replay.shrink`) and written as an ITF trace.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import Phase, settings

from ..impl import faults
from ..model.explore import Exploration, explore
from ..model.state import Bounds, State, initial_state
from . import campaign, itf, walks
from .coverage import Coverage
from .lockstep import Move, model_step
from .replay import FAILS, replay, shrink


@dataclass
class Kill:
    id: str
    killed: bool
    by: str | None
    """hypothesis or walk: the engine whose run failed first."""
    examples: int | None
    """Hypothesis examples, or walks, up to and including the first failure."""
    seconds: float | None
    """Seconds to the first failure."""
    trace_len: int | None
    """Moves in the shrunk trace."""
    failure: str | None
    trace: str | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def kill(bug: str, bounds: Bounds, backend: str, base: settings, *, walk_seconds: float,
         trace_dir: Path | None, explored: Callable[[], Exploration] | None = None,
         seed: int = 0) -> Kill:
    """Find `bug`: Hypothesis first, then guided walks from fresh coverage of `explored`."""
    no_shrink = settings(base, phases=[Phase.explicit, Phase.generate, Phase.target])
    result = campaign.run(bounds, backend, no_shrink, bug=bug)
    moves: list[Move] | None = None
    prompts: tuple[int, ...] = ()
    by, examples, seconds = None, None, None
    if result.failed and result.failing is not None:
        by, examples = "hypothesis", result.first_failure_examples
        seconds = result.first_failure_seconds
        moves, prompts = result.failing.moves, result.failing.prompts
        step = getattr(result.failing.error, "step", len(moves) - 1)
        moves = moves[: step + 1]
    else:
        cov = Coverage(explored() if explored is not None else explore(bounds))
        walk_start = time.perf_counter()
        with faults.planted(bug):
            walked = walks.run(cov, backend, seed=seed, until=1.0, seconds=walk_seconds)
        if walked.failure is not None:
            by, examples = "walk", walked.failure.walk + 1
            seconds = result.seconds + (time.perf_counter() - walk_start)
            moves = walked.failure.moves[: walked.failure.step + 1]
            prompts = walked.failure.prompts
    if moves is None:
        return Kill(bug, False, None, None, None, None, None, None)

    def fails(candidate: list[Move]) -> bool:
        with faults.planted(bug):
            return replay(bounds, backend, prompts, candidate).status == FAILS

    small = shrink(list(moves), fails)
    with faults.planted(bug):
        outcome = replay(bounds, backend, prompts, small)
    path = None
    if trace_dir is not None and outcome.divergence is not None:
        states = model_states(bounds, small)
        trace = itf.to_itf(bounds, backend, prompts, small, states, failure=outcome.divergence,
                           bug=bug, seed=seed)
        path = str(itf.write(Path(trace_dir) / f"{bug}.itf.json", trace))
    d = outcome.divergence
    return Kill(bug, outcome.status == FAILS, by, examples,
                round(seconds, 3) if seconds is not None else None, len(small),
                None if d is None else f"{d.kind}: {d.message}"[:300], path)


def model_states(bounds: Bounds, moves: list[Move]) -> list[State]:
    """The model state after each move (device moves and refusals leave it as it was)."""
    s, out = initial_state(bounds), []
    for move in moves:
        if move.kind == "act":
            t = model_step(s, bounds, move.action)
            s = t if t is not None else s
        out.append(s)
    return out


def matrix(bounds: Bounds, backend: str, base: settings, *, bugs: list[str] | None = None,
           walk_seconds: float = 60.0, trace_dir: Path | None = None,
           explored: Exploration | None = None) -> list[Kill]:
    """One kill per bug (tt-only bugs skipped on cpu); the graph is explored at most once."""
    chosen = bugs or [b for b in faults.BUGS if backend == "tt" or b not in faults.TT_ONLY]
    graph = functools.cache(lambda: explored or explore(bounds))
    out: list[Kill] = []
    for bug in chosen:
        out.append(kill(bug, bounds, backend, base, walk_seconds=walk_seconds,
                        trace_dir=trace_dir, explored=graph))
    return out

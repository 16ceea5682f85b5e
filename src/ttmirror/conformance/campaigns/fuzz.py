"""One `ttmirror fuzz` campaign: explore the model, run the Hypothesis state machine, then walk
the graph until every edge has been walked, all within one deadline.

`run(options, say)` does the work and returns a `Result`: the JSON report, whether the run
conforms (and covered what it had to), and the failure, if any, with its ITF trace. The command
line only parses its options into `Options` and prints the result; `say` receives the progress
lines.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis.database import ExampleDatabase

from ttmirror.conformance.campaigns import branches, campaign, checkpoint, profiles, shards, walks
from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.campaigns.walk_bound import walks_lower_bound
from ttmirror.conformance.lockstep import patterns
from ttmirror.conformance.traces import itf
from ttmirror.model.explore import explore
from ttmirror.model.state import Bounds

Say = Callable[[str], None]


@dataclass(frozen=True)
class Options:
    """What a campaign is asked to do (the command line's options, checked)."""

    bounds: Bounds
    backend: str
    config: str
    seed: int
    examples: int
    started: float
    """When the run began (`time.perf_counter()`): `seconds` counts from here, imports
    included."""
    seconds: float
    min_edges: float
    jobs: int
    profile: str | None
    traces: Path
    database: str
    """Where the Hypothesis examples are kept, as given (a folder or a redis:// address)."""
    example_db: ExampleDatabase | None
    shard: tuple[int, int] | None = None
    bug: str | None = None
    """A planted bug of the implementation (`$TTMIRROR_BUG`), or None."""
    walk_mode: str = "branches"
    """branches: each edge walked once from a saved state; from-initial: every walk from the
    initial state (a chip, or a shard of one plan)."""
    progress_every: float = 30.0
    """Seconds between two progress lines of the walks."""
    checkpoint: Path | None = None
    """Where the campaign's progress is saved and, if the file exists, resumed from."""
    checkpoint_every: float = 300.0
    """Seconds between two saves of the checkpoint during the walks."""


@dataclass(frozen=True)
class Failure:
    """A conformance failure: where its ITF trace was written, and what diverged."""

    path: Path | None
    message: str | None


@dataclass
class Result:
    report: dict[str, Any] | None
    """The JSON report (None when the exploration ran out of time)."""
    ok: bool
    failure: Failure | None = None
    problem: str | None = None
    """Why a run that did not fail still did not pass, in one line (None: it passed, or it
    failed with `failure`)."""


class _OutOfTime(Exception):
    """`--seconds` ran out during the exploration, after `states` states."""

    def __init__(self, states: int) -> None:
        super().__init__(states)
        self.states = states


def run(o: Options, say: Say) -> Result:
    """The campaign: exploration, Hypothesis and its shrinking, the walks, within the deadline."""
    deadline = o.started + o.seconds
    start = time.perf_counter()
    key = checkpoint.campaign_key(o.backend, o.config, o.seed, o.bounds._asdict(), o.bug)
    try:  # before exploring: a wrong file is refused at once
        resumed = checkpoint.load(o.checkpoint, key) if o.checkpoint else None
    except ValueError as e:
        return Result(None, False, problem=str(e))

    def explore_progress(states: int, transitions: int, frontier: int) -> None:
        if time.perf_counter() > deadline:
            raise _OutOfTime(states)

    try:
        cov = Coverage(explore(o.bounds, progress=explore_progress))
    except _OutOfTime as out:
        # Not a usage error: the run did what it was told and covered nothing.
        return Result(None, False, problem=(
            f"--seconds {o.seconds:g} ran out while exploring the model ({out.states:,} states "
            "so far): nothing walked; raise --seconds"))
    gc.freeze()  # the graph lives to the end: keep the collector from rescanning it
    try:
        return _walked(o, cov, deadline, time.perf_counter() - start, say, key, resumed)
    except patterns.NoDrafter as e:  # the walks cannot choose drafters here: say so in a line
        return Result(None, False, problem=f"{e}; walk smaller bounds")
    finally:
        gc.unfreeze()  # frozen objects are never collected: ttnn ones would outlive exit


def _walked(o: Options, cov: Coverage, deadline: float, explore_seconds: float,
            say: Say, key: dict[str, Any], resumed: checkpoint.Checkpoint | None) -> Result:
    """Hypothesis, then the walks, on the explored graph; the report of both."""
    explored = time.perf_counter()
    before = checkpoint.Progress()
    if resumed is not None:
        try:
            checkpoint.apply(resumed, cov)
        except ValueError as e:
            return Result(None, False, problem=f"--checkpoint {o.checkpoint}: {e}")
        before = resumed.progress
        cov.steps += before.steps
        say(f"resuming {o.checkpoint}: {before.runs} run(s) before this one walked "
            f"{before.walks:,} edges in {before.walk_seconds:.0f} s, edges_covered "
            f"{cov.edges_covered:.4f}; their Hypothesis phase is not repeated")
    say(f"explored {cov.total_edges:,} edges in {explore_seconds:.0f} s; Hypothesis: "
        f"{before.hypothesis_examples if resumed else o.examples} examples")
    hypothesis_seed = _hypothesis_seed(o)
    if resumed is None:
        result = campaign.run(o.bounds, o.backend, profiles.profile(o.profile),
                              seed=hypothesis_seed, trace_dir=o.traces, on_run=cov.record,
                              max_examples=max(1, o.examples), config=o.config,
                              deadline=deadline, bug=o.bug, database=o.example_db)
    else:
        result = campaign.Campaign(o.backend, o.config, o.bug, hypothesis_seed,
                                   before.hypothesis_examples, 0, 0.0, failed=False,
                                   observation=before.observation)
    saver = _Saver(o, key, before, result.examples, result.observation)
    walked: walks.Report | None = None
    failure: Failure | None = None
    stopped = "failure"
    if result.failed:
        failure = Failure(result.trace_path, result.error)
        if result.out_of_time:
            say("--seconds ran out while Hypothesis shrank a failure: its trace is the smallest "
                "failing run found by then")
    elif result.out_of_time:
        stopped = "seconds"
        say(f"--seconds ran out during the Hypothesis phase ({result.examples} examples); no "
            "guided walks")
    else:
        say(f"Hypothesis: {result.examples} examples, edges_covered {cov.edges_covered:.4f}; "
            f"guided walks on {o.jobs} worker(s) until {o.min_edges}")
        walked, failure = _walk(o, cov, max(0.0, deadline - time.perf_counter()), say, saver)
        stopped = walked.stopped
    if failure is None:  # a failing run's edges are not all checked: keep the last save
        saver.save(cov, walked, force=True)
    measured = failure is None and stopped != "seconds"
    lower_bound = _lower_bound(cov, deadline, say) if measured else None
    report = _report(o, cov, result, before, walked, failure, stopped, lower_bound,
                     explore_seconds, time.perf_counter() - explored)
    return _verdict(o, cov, report, walked, failure)


def _hypothesis_seed(o: Options) -> int:
    """Shards divide the Hypothesis phase by seed (shard i of a campaign seeded s draws with
    s + i - 1), as they divide the walks by index: no two draw from the same seed."""
    return o.seed + (o.shard[0] - 1 if o.shard else 0)


def _lower_bound(cov: Coverage, deadline: float, say: Say) -> int | None:
    """The fewest walks from the initial state that cover every edge, where time is left: a
    statistic, not a check, and a minimum flow over the whole graph (seconds at the default
    bounds), so a run that --seconds or a failure stopped does not spend time on it."""
    if time.perf_counter() >= deadline:
        return None
    bound = walks_lower_bound(cov.ex.graph)
    say(f"walks from the initial state cover the {cov.total_edges:,} edges in no fewer than "
        f"{bound:,}")
    return bound


def _report(o: Options, cov: Coverage, result: campaign.Campaign, before: checkpoint.Progress,
            walked: walks.Report | None, failure: Failure | None, stopped: str,
            lower_bound: int | None, explore_seconds: float, walk_seconds: float
            ) -> dict[str, Any]:
    """The run's JSON report: what `ttmirror fuzz --json` prints."""
    return {
        "backend": o.backend,
        "config": o.config,
        "observation": result.observation,
        "bounds": o.bounds._asdict(),
        "seed": o.seed,
        "hypothesis_seed": _hypothesis_seed(o),
        **coverage_figures(cov, walk_seconds + before.walk_seconds),
        "explore_seconds": round(explore_seconds, 2),
        "hypothesis_examples": result.examples,
        "hypothesis_first_failure_example": result.first_failure_examples,
        "database": o.database,
        "walk_mode": o.walk_mode,
        "walks": before.walks + (walked.walks if walked else 0),
        **({"passes": before.passes + (walked.passes if walked else 0),
            "unreachable_edges": walked.unreachable if walked else 0}
           if o.bounds.spec_tokens else {}),
        "shard": f"{o.shard[0]}/{o.shard[1]}" if o.shard else None,
        "covered_edges": shards.encode_ids(shards.edge_ids(cov)),
        "walks_taken": shards.encode_ids(walked.taken if walked else ()),
        "walks_lower_bound": lower_bound,
        "jobs": o.jobs,
        "stopped": stopped,
        "min_edges": o.min_edges,
        "failure": failure.message if failure else None,
        "trace": str(failure.path) if failure and failure.path else None,
        "total_seconds": round(time.perf_counter() - o.started, 1),
        **({"checkpoint": str(o.checkpoint), "runs": before.runs + 1,
            "resumed_at_edges": before.edges} if o.checkpoint else {}),
    }


def _verdict(o: Options, cov: Coverage, report: dict[str, Any], walked: walks.Report | None,
             failure: Failure | None) -> Result:
    if failure is not None:
        return Result(report, False, failure)
    if o.shard:  # a shard covers its share; `coverage merge` judges the union
        if walked is not None and walked.stopped == "covered":
            return Result(report, True)
        return Result(report, False, problem=(
            f"shard {report['shard']} did not take its whole share of the plan (walks stopped: "
            f"{report['stopped']}; raise --seconds or --jobs)"))
    # With drafts, edges that no drafter lets a run take are reported, not required.
    reachable = cov.total_edges - (walked.unreachable if walked is not None else 0)
    if cov.actions_covered == 1.0 and len(cov.edges) >= o.min_edges * reachable:
        return Result(report, True)
    return Result(report, False, problem=(
        f"coverage below the minimum: actions {cov.actions_covered:.3f}, edges "
        f"{cov.edges_covered:.4f} < {o.min_edges} (walks stopped: {report['stopped']}; raise "
        "--seconds or --jobs)"))


class _Saver:
    """Saves the campaign's checkpoint (if it has one) now and then during the walks, with the
    totals of the runs before this one added."""

    def __init__(self, o: Options, key: dict[str, Any], before: checkpoint.Progress,
                 examples: int, observation: str) -> None:
        self.path, self.every, self.key = o.checkpoint, o.checkpoint_every, key
        self.before, self.examples, self.observation = before, examples, observation
        self.start = self.last = time.perf_counter()

    def save(self, cov: Coverage, report: walks.Report | None, force: bool = False) -> None:
        now = time.perf_counter()
        if self.path is None or (not force and now - self.last < self.every):
            return
        b = self.before
        done = checkpoint.Progress(
            runs=b.runs + 1, steps=cov.steps, walks=b.walks + (report.walks if report else 0),
            passes=b.passes + (report.passes if report else 0),
            walk_seconds=round(b.walk_seconds + now - self.start, 1),
            hypothesis_examples=self.examples, observation=self.observation)
        checkpoint.save(self.path, self.key, cov, done)
        self.last = now


def _walk(o: Options, cov: Coverage, seconds: float, say: Say, saver: _Saver
          ) -> tuple[walks.Report, Failure | None]:
    """The guided walks, for at most `seconds`; a failing walk is written as an ITF trace named
    after seed and walk."""
    every = o.progress_every

    def progress(report: walks.Report, cov: Coverage) -> None:
        rate = report.steps / report.seconds if report.seconds > 0 else 0.0
        say(f"{report.seconds:6.0f} s  walks {report.walks:,}  edges_covered "
            f"{cov.edges_covered:.4f}  {rate:,.0f} steps/s")
        saver.save(cov, report)

    if o.walk_mode == "branches":
        # The implementation's state can be saved: each edge is walked once, from a saved state.
        walked = branches.run(cov, o.backend, seed=o.seed, until=o.min_edges, seconds=seconds,
                              jobs=o.jobs, progress=progress, every=every, config=o.config,
                              bug=o.bug, prune=saver.before.runs > 0)
    else:  # a chip cannot be saved, and a shard takes its share of one plan: planned walks
        walked = walks.run(cov, o.backend, seed=o.seed, until=o.min_edges, seconds=seconds,
                           jobs=o.jobs, progress=progress, every=every, config=o.config,
                           shard=o.shard, bug=o.bug)
    failed = walked.failure
    if failed is None:
        return walked, None
    trace = itf.to_itf(o.bounds, o.backend, failed.prompts, failed.moves, failed.states,
                       failure=failed.error, bug=o.bug, seed=o.seed, config=o.config,
                       sampling=failed.sampling, sampling_seed=failed.sampling_seed,
                       drafter=failed.drafter)
    name = f"walk-{o.backend}-{o.config}-seed{o.seed}-walk{failed.walk}.itf.json"
    return walked, Failure(itf.write(o.traces / name, trace), str(failed.error))


def coverage_figures(cov: Coverage, seconds: float) -> dict[str, Any]:
    return {
        "actions_covered": round(cov.actions_covered, 4),
        "edges_covered": round(cov.edges_covered, 4),
        "edges": len(cov.edges),
        "total_edges": cov.total_edges,
        "steps": cov.steps,
        "steps_per_second": round(cov.steps / seconds, 1) if seconds > 0 else None,
        "seconds": round(seconds, 2),
    }

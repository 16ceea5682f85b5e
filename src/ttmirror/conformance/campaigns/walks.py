"""Planned walks replayed against the implementation, in this process or across worker processes.

The planner (`coverage.Planner`) decides every walk's actions up front, from the seed and the
graph alone; each walk's device completions and prompts come from its own generator, seeded by
(seed, walk number). A walk therefore does the same thing whichever process runs it, so a
campaign over many processes plans the same walks as one over a single process, and a failing
walk is its seed plus its trace.

Refusals (every model-disabled action must be refused) are tried once per model state and
process rather than after every act: a walk's prefix revisits states that earlier walks checked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from ttmirror.conformance.campaigns.coverage import Coverage, Planner
from ttmirror.conformance.campaigns.workers import Workers, one_core
from ttmirror.conformance.lockstep import patterns
from ttmirror.conformance.lockstep.harness import (
    SAMPLERS,
    Divergence,
    Lockstep,
    Move,
    prompts_from,
)
from ttmirror.conformance.traces.moves import Drafter
from ttmirror.model.actions import Action
from ttmirror.model.state import Bounds, State

DEVICE_MOVES = 0.35
"""Chance of completing one more device command before each act (the device lags the host)."""
BATCH = 8
"""Walks per message to a worker; two messages stay in flight per worker."""


@dataclass
class Walk:
    id: int
    actions: list[Action]
    guesses: dict[patterns.Bit, bool] | None = None
    """With drafts: which of the drafter's guesses are right along the walk (`patterns.py`)."""


@dataclass
class FailedWalk:
    """A walk that diverged: enough to write its trace (and to cross a process boundary)."""

    walk: int
    prompts: tuple[int, ...]
    moves: list[Move]
    states: list[State]
    kind: str
    message: str
    step: int
    sampling: str = "greedy"
    sampling_seed: int = 0
    drafter: Drafter | None = None

    @property
    def error(self) -> Divergence:
        return Divergence(self.kind, self.message, self.step)


@dataclass
class WalkResult:
    walk: int
    steps: int
    """Moves performed: acts and device completions."""
    failure: FailedWalk | None = None


def walk_rng(seed: int, walk: int) -> random.Random:
    """The generator of one walk's prompts and device completions."""
    return random.Random(f"{seed}/{walk}")


class Executor:
    """Runs walks in lockstep on one backend, remembering which states' refusals were tried."""

    def __init__(self, bounds: Bounds, backend: str, seed: int, config: str | None = None,
                 bug: str | None = None) -> None:
        self.bounds, self.backend, self.seed, self.config = bounds, backend, seed, config
        self.bug = bug
        self.refused: set[State] = set()

    def run(self, walk: Walk) -> WalkResult:
        rng = walk_rng(self.seed, walk.id)
        base = rng.randrange(64)
        sampling = rng.choice(SAMPLERS)
        drafter = None
        if walk.guesses is not None:  # prompts that let a drafter guess as the walk needs
            requests = self.bounds.requests
            base = patterns.choose_base(sampling, requests, sorted(walk.guesses), base)
            drafter = patterns.drafter_for(sampling, base, requests, walk.guesses)
        prompts = prompts_from(base, self.bounds.requests)
        ls = Lockstep(self.bounds, self.backend, prompts, refused=self.refused,
                      config=self.config, sampling=sampling, sampling_seed=base, bug=self.bug,
                      drafter=drafter)
        try:
            for action in walk.actions:
                while rng.random() < DEVICE_MOVES:
                    ready = [cq for cq in (0, 1) if ls.device_ready(cq)]
                    if not ready:
                        break
                    ls.advance_device(rng.choice(ready))
                ls.act(action)
        except Divergence as d:
            failed = FailedWalk(walk.id, ls.prompts, list(ls.moves), list(ls.states), d.kind,
                                d.message, d.step, sampling, base, ls.drafter)
            return WalkResult(walk.id, len(ls.moves), failed)
        finally:
            ls.close()
        return WalkResult(walk.id, len(ls.moves))


@dataclass
class Report:
    """What a campaign of walks did, and why it stopped."""

    walks: int = 0
    """Walks that conformed."""
    steps: int = 0
    seconds: float = 0.0
    jobs: int = 1
    failure: FailedWalk | None = None
    stopped: str = ""
    """Why the walks stopped: covered, budget (seconds), walks (`max_walks` planned), exhausted
    or failure."""
    taken: list[int] = field(default_factory=list)
    """The planned walks' ids replayed and conformed (a shard's share of the plan)."""
    passes: int = 0
    """With drafts, branch walks: the searches run, one per pattern of the drafter's guesses."""
    unreachable: int = 0
    """With drafts: edges no drafter lets a run take (`patterns.Requirements.unreachable`)."""


type Progress = Callable[[Report, Coverage], None]


def run(cov: Coverage, backend: str, *, seed: int, until: float, seconds: float, jobs: int = 1,
        progress: Progress | None = None, every: float = 5.0, config: str | None = None,
        shard: tuple[int, int] | None = None, bug: str | None = None,
        max_walks: int | None = None) -> Report:
    """Plan and replay walks until edges_covered reaches `until`, `seconds` pass, `max_walks`
    walks are planned (a budget the machine's speed does not change), or one fails.

    `jobs` > 1 replays the walks in that many worker processes (each with its own emulated
    device); `bug`, if any, is planted in each of them. `shard` (i, n), 1 <= i <= n:
    the whole plan is made, from no coverage (a pure function of the seed and the bounds), and
    only walks i - 1, i - 1 + n, ... are replayed here, so n shards take every walk once.
    """
    campaign = _Campaign(cov, seed=seed, until=until, seconds=seconds, jobs=jobs, shard=shard,
                         max_walks=max_walks)
    pool = _Pool(cov.ex.bounds, backend, seed, jobs, config, bug) if jobs > 1 else None
    local = Executor(cov.ex.bounds, backend, seed, config, bug) if pool is None else None
    next_report = campaign.start + every
    try:
        while campaign.report.failure is None:
            if progress is not None and time.perf_counter() >= next_report:
                progress(campaign.elapsed(), cov)
                next_report = time.perf_counter() + every
            busy = campaign.walk_here(local) if local is not None else campaign.feed(pool)
            if not busy:
                break
    finally:
        if pool is not None:
            pool.close(kill=campaign.report.failure is not None)
    report = campaign.finish()
    report.taken.sort()
    if progress is not None:
        progress(report, cov)
    return report


class _Campaign:
    """The walks of one `run`: planned toward the goal, confirmed as their results come back."""

    def __init__(self, cov: Coverage, *, seed: int, until: float, seconds: float,
                 jobs: int, shard: tuple[int, int] | None = None,
                 max_walks: int | None = None) -> None:
        self.cov = cov
        self.max_walks = max_walks
        self.shard = shard
        self.planner = Planner(cov, random.Random(seed), fresh=shard is not None)
        self.reqs = patterns.Requirements.of(cov.ex) if cov.ex.bounds.spec_tokens else None
        self.report = Report(jobs=jobs)
        self.start = time.perf_counter()
        self.deadline = self.start + seconds
        self.goal = int(until * cov.total_edges + 0.999999)
        self.pending: dict[int, list[int]] = {}
        """Walk id -> its edge ids, planned and not yet confirmed."""

    def elapsed(self) -> Report:
        self.report.seconds = time.perf_counter() - self.start
        return self.report

    def plan(self, most: int) -> list[Walk]:
        """Up to `most` walks, while the goal is not planned yet and time is left."""
        out: list[Walk] = []
        planner, goal, deadline = self.planner, self.goal, self.deadline
        while len(out) < most and planner.closed < goal and time.perf_counter() < deadline:
            if self.max_walks is not None and planner.planned >= self.max_walks:
                self.report.stopped = "walks"
                break
            path = planner.plan()
            if path is None:
                self.report.stopped = "exhausted"
                break
            walk_id = planner.planned - 1
            if self.shard is not None and walk_id % self.shard[1] != self.shard[0] - 1:
                continue  # another shard's walk: planned (the plan is the same), not taken
            walk = self._walk(walk_id, path)
            self.pending[walk.id] = path[: len(walk.actions)]
            out.append(walk)
        return out

    def _walk(self, walk_id: int, path: list[int]) -> Walk:
        """The walk along `path`; with drafts, with the guesses its launches need, and cut
        before a launch whose need contradicts an earlier one's (no drafter takes it there)."""
        planner, reqs = self.planner, self.reqs
        if reqs is None:
            return Walk(walk_id, [planner.action(e) for e in path])
        need: patterns.Need | None = patterns.NOTHING
        taken = []
        for e in path:
            assert need is not None
            merged = patterns.merge(need, reqs.edge_need.get(planner.edge(e), patterns.NOTHING))
            if merged is None:
                break
            need = merged
            taken.append(e)
        assert need is not None
        return Walk(walk_id, [planner.action(e) for e in taken], reqs.assignment(need))

    def walk_here(self, executor: Executor) -> bool:
        """Plan one walk and replay it in this process; False when none is left to plan."""
        batch = self.plan(1)
        if not batch:
            return False
        self.confirm(executor.run(batch[0]))
        return True

    def feed(self, pool: _Pool | None) -> bool:
        """Keep the workers fed and confirm what came back; False once they are all idle."""
        assert pool is not None
        while pool.hungry() and (batch := self.plan(BATCH)):
            pool.send(batch)
        if not pool.busy():
            return False
        for result in pool.receive(timeout=0.5):
            self.confirm(result)
        return True

    def confirm(self, result: WalkResult) -> None:
        """Count a walk's steps; mark its edges covered if it conformed, else keep its failure
        (the lowest-numbered failing walk, whichever worker finished first)."""
        path = self.pending.pop(result.walk)
        report = self.report
        report.steps += result.steps
        self.cov.steps += result.steps
        if result.failure is not None:
            if report.failure is None or result.walk < report.failure.walk:
                report.failure = result.failure
            return
        report.walks += 1
        report.taken.append(result.walk)
        for e in path:
            u, v = self.planner.edge(e)
            self.cov.mark(u, v, self.planner.action(e).name)

    def finish(self) -> Report:
        report = self.elapsed()
        if report.failure is not None:
            report.stopped = "failure"
        elif self.shard is not None and self.planner.closed >= self.goal and not self.pending:
            report.stopped = "covered"  # the whole plan made and this shard's share taken
        elif len(self.cov.edges) >= self.goal:
            report.stopped = "covered"
        elif not report.stopped:
            report.stopped = "budget"
        return report


class _Pool:
    """Worker processes, each replaying the batches of walks it is sent."""

    def __init__(self, bounds: Bounds, backend: str, seed: int, jobs: int, config: str | None,
                 bug: str | None) -> None:
        self.workers = Workers.start(_serve, [(bounds, backend, seed, bug, config)] * jobs)
        self.conns = self.workers.conns
        self.inflight: dict[Connection, int] = dict.fromkeys(self.conns, 0)

    def hungry(self) -> bool:
        return min(self.inflight.values()) < 2

    def busy(self) -> bool:
        return any(self.inflight.values())

    def send(self, batch: list[Walk]) -> None:
        conn = min(self.conns, key=lambda c: self.inflight[c])
        conn.send(batch)
        self.inflight[conn] += 1

    def receive(self, timeout: float) -> list[WalkResult]:
        out: list[WalkResult] = []
        for conn in wait([c for c in self.conns if self.inflight[c]], timeout=timeout):
            assert isinstance(conn, Connection)
            try:
                message = conn.recv()
            except (EOFError, OSError):
                raise RuntimeError("a walk worker process died; rerun with --jobs 1 to see "
                                   "why") from None
            if isinstance(message, str):
                raise RuntimeError(f"a walk worker failed: {message}")
            self.inflight[conn] -= 1
            out.extend(message)
        return out

    def close(self, kill: bool) -> None:
        self.workers.stop(kill=kill, goodbye=None)


def _serve(bounds: Bounds, backend: str, seed: int, bug: str | None, config: str | None,
           conn: Connection) -> None:
    """A worker: replay each batch it receives, answer with the results; None ends it."""
    one_core()
    executor = Executor(bounds, backend, seed, config, bug)
    while (batch := conn.recv()) is not None:
        try:
            conn.send([executor.run(walk) for walk in batch])
        except Exception as e:  # a harness error, not a divergence: say it in one line
            conn.send(f"{type(e).__name__}: {e}")
            return

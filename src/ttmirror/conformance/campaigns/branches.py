"""Every edge of the explored graph walked once, from saved states instead of the initial one.

A depth-first search over the graph drives one run in lockstep. On reaching a model state for the
first time with more than one edge still to walk from it, it saves the run (`Lockstep.snapshot`:
model side, runner, mirror, emulated memory, queues, events, traces); the first edge goes on with
the live run, every other one with a run restored from the save. So each edge is walked once and
each state expanded once, and the moves total about the number of edges (walks from the initial
state, as `walks.py` plans them, repeat their prefixes: about 40 times more moves at the default
bounds).

Before each act the device may complete commands, as in the planned walks: each ready queue's
head, with chance `walks.DEVICE_MOVES`, drawn from one generator seeded by the seed. A failure
is reported with the run's whole history from the initial state (restored runs carry their
moves), so its trace replays from the start like any other.

With `jobs` > 1 the search runs in that many worker processes. A saved state is bytes, so a
branch point is a unit of work that can cross a process boundary: the first worker starts at the
initial state, and whenever a worker is idle, a busy one gives away the deepest-rooted branch
point it has not started (the oldest frame of its stack, with the edges left there). Which
states are expanded is one shared byte per state, so a state is expanded once whichever worker
reaches it first (a rare race expands it twice; both walks are checked). With one job the
search's order is fixed by the graph and the seed replays it; with several, who reaches a state
first varies, and a failure is its trace.

Saving needs the implementation's state as data: the emulated device or the cpu backend; a chip
cannot be saved, and there the planned walks from the initial state remain.

With drafts (spec rule 13) a run takes only the launch edges its drafter's guesses allow
(`patterns.py`), so the search runs in passes: each pass fixes one pattern of right and wrong
guesses (a drafter; the prompts are chosen once so that every pattern is one), walks the graph
restricted to the launch edges that pattern allows, and prunes every branch from which no edge
still uncovered can be reached in that restricted graph (reverse reachability on the DAG).
Passes go on, each with the pattern the first uncovered edge needs, until every edge a drafter
can take is covered; an edge that none can take is reported (`Report.unreachable`).
"""

from __future__ import annotations

import gc
import random
import time
from array import array
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from ttmirror.conformance.campaigns.coverage import Coverage
from ttmirror.conformance.campaigns.walk_bound import require_acyclic
from ttmirror.conformance.campaigns.walks import DEVICE_MOVES, FailedWalk, Report
from ttmirror.conformance.campaigns.workers import Workers, one_core
from ttmirror.conformance.lockstep import patterns
from ttmirror.conformance.lockstep.harness import (
    SAMPLERS,
    Divergence,
    Lockstep,
    prompts_from,
)
from ttmirror.conformance.traces.moves import Drafter
from ttmirror.model.actions import Action
from ttmirror.model.state import Bounds, State

type Progress = Callable[[Report, Coverage], None]
type Edge = tuple[int, int, str]
"""(source state, target state, the action's name): an edge walked and checked."""
POLL_EVERY = 64
"""Edges between two looks at the master's messages (a worker's)."""


@dataclass
class Item:
    """A branch point: a state, the run that reached it (saved), the edges left to walk there."""

    node: int
    saved: bytes
    todo: list[tuple[Action, State, int]]


@dataclass
class _Frame:
    """A state being expanded: the edges left to walk from it, the run that reached it (used
    by the first edge) and its save (restored for every other edge)."""

    node: int
    todo: list[tuple[Action, State, int]]
    live: Lockstep | None
    saved: bytes | None


class Search:
    """The depth-first search of one process: expands states, walks their edges, reports them.

    `expanded` has one byte per state (shared between processes when several search); `covered`
    are edges walked before (by Hypothesis): one of those is walked again only if its target
    has not been expanded yet, since expanding a state needs a run that reached it.
    """

    def __init__(self, index: Mapping[State, int], bounds: Bounds, backend: str, *, seed: int,
                 config: str | None = None, covered: set[tuple[int, int]] | None = None,
                 expanded: MutableSequence[int] | None = None, bug: str | None = None,
                 drafter: Drafter | None = None, useful: bytes | None = None,
                 setup: tuple[int, str] | None = None) -> None:
        """With drafts: `drafter` is the pass's, `useful` says per state whether an uncovered
        edge can be reached from it under that drafter (None: every state), and `setup` is
        the (base, sampler) that every run of the pass uses (default: drawn from `seed`)."""
        self.index, self.bounds, self.backend, self.config = index, bounds, backend, config
        self.bug = bug
        """Planted in every run the search starts (a saved run carries it in its runner)."""
        self.drafter, self.useful = drafter, useful
        self.covered = covered if covered is not None else set()
        self.expanded = expanded if expanded is not None else bytearray(len(index))
        self.rng = random.Random(f"branches/{seed}")
        self.base, self.sampling = setup or draw_setup(seed)
        self.refused: set[State] = set()
        self.walked: list[Edge] = []
        """Edges walked and checked, not yet handed over (`take_walked`)."""
        self.steps = 0
        self.saves = 0
        """Runs saved (at states with more than one edge to walk)."""
        self.restores = 0
        self.failure: FailedWalk | None = None
        self.stack: list[_Frame] = []

    # --- starting points -------------------------------------------------------------------------
    def start_at_initial_state(self) -> None:
        first = Lockstep(self.bounds, self.backend, prompts_from(self.base, self.bounds.requests),
                         refused=self.refused, config=self.config, sampling=self.sampling,
                         sampling_seed=self.base, bug=self.bug, drafter=self.drafter)
        self.stack.append(self._frame(0, first))

    def start_at(self, item: Item) -> None:
        self.stack.append(_Frame(item.node, item.todo, None, item.saved))

    def give_away(self) -> Item | None:
        """The oldest branch point with edges left that this search has not started, taken off
        its stack for another process; None if it has none."""
        for frame in self.stack[:-1]:  # the top one is being walked
            if frame.todo and frame.saved is not None:
                item = Item(frame.node, frame.saved, frame.todo)
                frame.todo = []
                return item
        return None

    # --- the search ------------------------------------------------------------------------------
    def walk(self, deadline: float, poll: Callable[[], bool] | None = None) -> bool:
        """Walk until the stack is empty (True), a run fails, time is up or `poll` (called
        every `POLL_EVERY` edges) says stop (False)."""
        stack = self.stack
        count = 0
        # Every restore allocates a run and every discard leaves one as cyclic garbage: collect
        # the young generations here, between edges, instead of letting allocation counts
        # trigger full collections that rescan everything the process holds.
        automatic = gc.isenabled()
        gc.disable()
        try:
            while stack:
                count += 1
                if count % POLL_EVERY == 0:
                    # Now and then all generations: a run kept long enough to grow old (a
                    # deep branch point's) is garbage in the oldest one once discarded.
                    gc.collect(2 if count % (POLL_EVERY * 64) == 0 else 1)
                    if time.perf_counter() >= deadline or (poll is not None and not poll()):
                        return False
                frame = stack[-1]
                if not frame.todo:
                    stack.pop()
                    if frame.live is not None:
                        frame.live.discard()
                    continue
                action, target, v = frame.todo.pop()
                ls, frame.live = frame.live, None
                if ls is None:
                    assert frame.saved is not None
                    ls = Lockstep.restore(frame.saved, self.refused)
                    self.restores += 1
                before = len(ls.moves)
                try:
                    self._take(ls, action, target)
                except Divergence as d:
                    self.failure = FailedWalk(
                        len(self.walked), ls.prompts, list(ls.moves), list(ls.states), d.kind,
                        d.message, d.step, self.sampling, self.base, ls.drafter)
                    self.steps += len(ls.moves) - before
                    ls.discard()
                    return False
                self.steps += len(ls.moves) - before
                self.walked.append((frame.node, v, action.name))
                if self.expanded[v] or not self._useful(v):
                    ls.discard()
                else:
                    stack.append(self._frame(v, ls))
            return True
        finally:
            if automatic:
                gc.enable()
            if not stack or self.failure is not None:
                self.close()

    def close(self) -> None:
        """Discard every run still held (the search is over)."""
        for frame in self.stack:
            if frame.live is not None:
                frame.live.discard()
        self.stack.clear()
        gc.collect()  # discarded runs are cycles: their ttnn host tensors go now, not at exit

    def take_walked(self) -> list[Edge]:
        walked, self.walked = self.walked, []
        return walked

    def _useful(self, v: int) -> bool:
        """Can an uncovered edge still be reached from state v (with drafts, in this pass)?"""
        return self.useful is None or bool(self.useful[v])

    def _frame(self, u: int, ls: Lockstep) -> _Frame:
        """Expand state `u`, reached by `ls`: its edges still to walk (those not covered, and
        those leading to a useful state not expanded yet), saving `ls` if there is more than
        one. The edges are the run's: with drafts, the launches its drafter allows."""
        self.expanded[u] = 1
        index, covered, expanded = self.index, self.covered, self.expanded
        todo: list[tuple[Action, State, int]] = []
        seen: set[int] = set()
        for action, target in ls.successors():
            v = index[target]
            if v in seen:  # another action to the same state: the edge is one
                continue
            seen.add(v)
            if (u, v) not in covered or (not expanded[v] and self._useful(v)):
                todo.append((action, target, v))
        todo.reverse()  # popped from the end: walked in the model's order
        saved = None
        if len(todo) > 1:
            saved = ls.snapshot()
            self.saves += 1
        return _Frame(u, todo, ls, saved)

    def _take(self, ls: Lockstep, action: Action, target: State) -> None:
        """Complete device commands at random (the device lags the host), then act."""
        rng = self.rng
        while rng.random() < DEVICE_MOVES:
            ready = [cq for cq in (0, 1) if ls.device_ready(cq)]
            if not ready:
                break
            ls.advance_device(rng.choice(ready))
        ls.act(action, target)


def run(cov: Coverage, backend: str, *, seed: int, seconds: float, until: float = 1.0,
        jobs: int = 1, progress: Progress | None = None, every: float = 5.0,
        config: str | None = None, bug: str | None = None, prune: bool = False) -> Report:
    """Walk the edges of `cov`'s graph not walked yet, in `jobs` processes, `bug` planted in
    every run, until edges_covered reaches `until`, `seconds` pass or a run fails; marks each
    edge walked (and checked) in `cov`. `prune` (a resumed campaign, most edges covered):
    without drafts too, enter only states from which an uncovered edge can be reached."""
    require_acyclic(cov.ex.graph)  # a state is expanded once: the search must end
    start = time.perf_counter()
    goal = int(until * cov.total_edges + 0.999999)
    if cov.ex.bounds.spec_tokens:
        report = _passes(cov, backend, seed=seed, deadline=start + seconds, until=until,
                         jobs=jobs, progress=progress, every=every, config=config, bug=bug)
        goal = int(until * (cov.total_edges - report.unreachable) + 0.999999)
    else:
        useful = _reaching(cov) if prune else None
        if jobs == 1:
            report = _run_here(cov, backend, seed=seed, deadline=start + seconds, goal=goal,
                               progress=progress, every=every, config=config, bug=bug,
                               useful=useful)
        else:
            report = _Master(cov, backend, seed=seed, jobs=jobs, config=config, bug=bug,
                             useful=useful).run(start + seconds, goal, progress, every)
    report.seconds = time.perf_counter() - start
    if report.failure is not None:
        report.stopped = "failure"
    elif not report.stopped:
        report.stopped = "covered" if len(cov.edges) >= goal else "exhausted"
    if progress is not None:
        progress(report, cov)
    return report


def draw_setup(seed: int) -> tuple[int, str]:
    """The (base of the prompts, sampler) of a search seeded `seed`."""
    rng = random.Random(f"branches/{seed}/prompts")  # the same in every worker
    base = rng.randrange(64)
    return base, rng.choice(SAMPLERS)


def _passes(cov: Coverage, backend: str, *, seed: int, deadline: float, until: float,
            jobs: int, progress: Progress | None, every: float, config: str | None,
            bug: str | None) -> Report:
    """With drafts: one search per pattern, each pruned to what is still uncovered under it,
    until every edge a drafter allows is covered (or time is up, or a run fails)."""
    reqs = patterns.Requirements.of(cov.ex)
    pairs = sorted(cov.ex.graph.edges())
    unreachable = set(reqs.unreachable(pairs))
    goal = int(until * (len(pairs) - len(unreachable)) + 0.999999)
    base, sampling = draw_setup(seed)
    base = patterns.choose_base(sampling, cov.ex.bounds.requests, reqs.bits, base)
    preds = _predecessors(cov)
    report = Report(jobs=jobs, unreachable=len(unreachable))
    start = time.perf_counter()

    def so_far(done: Report, cov: Coverage) -> None:  # the passes before this one, and this
        if progress is not None:
            progress(Report(walks=report.walks + done.walks, steps=report.steps + done.steps,
                            seconds=time.perf_counter() - start, jobs=jobs,
                            passes=report.passes + 1), cov)

    while len(cov.edges) < goal and time.perf_counter() < deadline:
        uncovered = [e for e in pairs if e not in cov.edges and e not in unreachable]
        pattern = reqs.choose(uncovered)
        assert pattern is not None  # each uncovered edge here has a need: one is chosen
        drafter = patterns.drafter_for(sampling, base, cov.ex.bounds.requests,
                                       reqs.assignment(pattern))
        useful = _useful(reqs, pattern, uncovered, preds, len(cov.ex.states))
        setup = (base, sampling)
        before = len(cov.edges)
        if jobs == 1:
            done = _run_here(cov, backend, seed=seed, deadline=deadline, goal=goal,
                             progress=so_far, every=every, config=config, bug=bug,
                             drafter=drafter, useful=useful, setup=setup)
        else:
            done = _Master(cov, backend, seed=seed, jobs=jobs, config=config, bug=bug,
                           drafter=drafter, useful=useful, setup=setup).run(
                deadline, goal, so_far, every)
        report.walks += done.walks
        report.steps += done.steps
        report.passes += 1
        if done.failure is not None:
            report.failure = done.failure
            break
        if done.stopped == "budget":
            report.stopped = "budget"
            break
        if len(cov.edges) == before:  # the pattern's drafter took none of the edges it needs
            raise RuntimeError(f"harness: the pass under pattern {pattern} covered no edge")
    if not report.stopped and report.failure is None and len(cov.edges) >= goal:
        report.stopped = "covered"
    return report


def _predecessors(cov: Coverage) -> tuple[array[int], array[int]]:
    """Each state's predecessors in the graph, compressed: state v's are
    ``preds[start[v]:start[v + 1]]`` (arrays: nothing for the collector to scan)."""
    return cov.ex.edges.predecessors(len(cov.ex.states))


def _useful(reqs: patterns.Requirements, pattern: patterns.Need,
            uncovered: list[tuple[int, int]], preds: tuple[array[int], array[int]],
            n: int) -> bytes:
    """Per state, 1 if an uncovered edge that `pattern` allows is reachable from it through
    edges it allows (reverse reachability from those edges' sources)."""
    return _reaching_edges(uncovered, preds, n, lambda u, v: reqs.allows(pattern, u, v))


def _reaching(cov: Coverage) -> bytes:
    """Per state, 1 if an uncovered edge is reachable from it (without drafts: every edge is
    every run's)."""
    uncovered = [e for e in cov.ex.graph.edges() if e not in cov.edges]
    return _reaching_edges(uncovered, _predecessors(cov), len(cov.ex.states),
                           lambda u, v: True)


def _reaching_edges(edges: list[tuple[int, int]], preds: tuple[array[int], array[int]], n: int,
                    allows: Callable[[int, int], bool]) -> bytes:
    """Per state, 1 if one of `edges` (that `allows` admits) is reachable from it through
    edges `allows` admits: reverse reachability from those edges' sources."""
    start, pred = preds
    useful = bytearray(n)
    stack = []
    for u, v in edges:
        if not useful[u] and allows(u, v):
            useful[u] = 1
            stack.append(u)
    while stack:
        v = stack.pop()
        for i in range(start[v], start[v + 1]):
            u = pred[i]
            if not useful[u] and allows(u, v):
                useful[u] = 1
                stack.append(u)
    return bytes(useful)


def _mark(cov: Coverage, report: Report, walked: list[Edge]) -> None:
    for u, v, name in walked:
        cov.mark(u, v, name)
    report.walks += len(walked)


def _run_here(cov: Coverage, backend: str, *, seed: int, deadline: float, goal: int,
              progress: Progress | None, every: float, config: str | None,
              bug: str | None, drafter: Drafter | None = None, useful: bytes | None = None,
              setup: tuple[int, str] | None = None) -> Report:
    report = Report(jobs=1)
    search = Search(cov.index, cov.ex.bounds, backend, seed=seed, config=config,
                    covered=set(cov.edges), bug=bug, drafter=drafter, useful=useful, setup=setup)
    start = time.perf_counter()
    next_report = start + every

    def poll() -> bool:
        nonlocal next_report
        _mark(cov, report, search.take_walked())
        now = time.perf_counter()
        if progress is not None and now >= next_report:
            report.steps, report.seconds = search.steps, now - start
            progress(report, cov)
            next_report = now + every
        return len(cov.edges) < goal

    search.start_at_initial_state()
    done = search.walk(deadline, poll)
    _mark(cov, report, search.take_walked())
    report.steps = search.steps
    cov.steps += search.steps
    report.failure = search.failure
    if not done and report.failure is None:
        report.stopped = "covered" if len(cov.edges) >= goal else "budget"
        search.close()
    return report


class _Master:
    """Hands branch points to worker processes and collects the edges they walked."""

    def __init__(self, cov: Coverage, backend: str, *, seed: int, jobs: int,
                 config: str | None, bug: str | None, drafter: Drafter | None = None,
                 useful: bytes | None = None, setup: tuple[int, str] | None = None) -> None:
        self.cov, self.jobs = cov, jobs
        self.report = Report(jobs=jobs)
        self.shared = SharedMemory(create=True, size=max(1, len(cov.ex.states)))
        args = (cov.ex.states, cov.ex.bounds, backend, seed, config, bug,
                set(cov.edges), self.shared.name, drafter, useful, setup)
        self.workers = Workers.start(_serve, [(w, *args) for w in range(jobs)])
        self.conns = self.workers.conns
        self.busy: set[Connection] = set()
        self.asked: set[Connection] = set()
        self.queue: list[Item] = []

    def run(self, deadline: float, goal: int, progress: Progress | None, every: float
            ) -> Report:
        report, cov = self.report, self.cov
        start = time.perf_counter()
        next_report = start + every
        idle = list(self.conns)
        try:
            first = idle.pop(0)
            first.send(("initial", deadline - time.perf_counter()))
            self.busy.add(first)
            while self.busy and report.failure is None:
                if len(cov.edges) >= goal:
                    report.stopped = "covered"
                    break
                now = time.perf_counter()
                if now >= deadline:
                    report.stopped = "budget"
                    break
                if progress is not None and now >= next_report:
                    report.seconds = now - start
                    progress(report, cov)
                    next_report = now + every
                while idle and self.queue:
                    conn = idle.pop()
                    conn.send(("item", self.queue.pop(), deadline - time.perf_counter()))
                    self.busy.add(conn)
                if idle:  # still hungry: ask a busy worker that has not been asked to share
                    for asked in self.busy - self.asked:
                        asked.send(("give",))
                        self.asked.add(asked)
                        break
                for ready in wait(list(self.busy), timeout=0.5):
                    assert isinstance(ready, Connection)
                    conn = ready
                    kind, *rest = self._receive(conn)
                    if kind == "edges":
                        self._count(*rest)
                    elif kind == "item":
                        self.asked.discard(conn)
                        if rest[0] is not None:
                            self.queue.append(rest[0])
                    elif kind == "idle":
                        self._count(*rest)
                        self.busy.discard(conn)
                        self.asked.discard(conn)
                        idle.append(conn)
                    elif kind == "failure":
                        self._count(*rest[1:])
                        report.failure = rest[0]
        finally:
            self.close(kill=report.failure is not None or bool(self.busy))
        return report

    def _count(self, walked: list[Edge], steps: int) -> None:
        _mark(self.cov, self.report, walked)
        self.report.steps += steps
        self.cov.steps += steps

    def _receive(self, conn: Connection) -> tuple[Any, ...]:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            raise RuntimeError("a branch-walk worker process died; rerun with --jobs 1 to see "
                               "why") from None
        if message[0] == "error":
            raise RuntimeError(f"a branch-walk worker failed: {message[1]}")
        return message  # type: ignore[no-any-return]

    def close(self, kill: bool) -> None:
        self.workers.stop(kill=kill, goodbye=("stop",))
        self.shared.close()
        self.shared.unlink()


def _serve(worker: int, states: list[State], bounds: Bounds, backend: str, seed: int,
           config: str | None, bug: str | None, covered: set[tuple[int, int]], shared: str,
           drafter: Drafter | None, useful: bytes | None, setup: tuple[int, str] | None,
           conn: Connection) -> None:
    """A worker: search from each branch point it is given; share one when asked."""
    one_core()
    memory = SharedMemory(name=shared)
    search: Search | None = None
    try:
        index = {s: i for i, s in enumerate(states)}
        del states
        gc.freeze()  # the index lives to the end: keep full collections from rescanning it
        search = here = Search(index, bounds, backend, seed=seed * 1000 + worker, config=config,
                               covered=covered, expanded=memory.buf,  # type: ignore[arg-type]
                               bug=bug, drafter=drafter, useful=useful, setup=setup)
        sent_steps = 0

        def report() -> tuple[list[Edge], int]:
            nonlocal sent_steps
            steps, sent_steps = here.steps - sent_steps, here.steps
            return here.take_walked(), steps

        def poll() -> bool:
            conn.send(("edges", *report()))
            while conn.poll():
                message = conn.recv()
                if message[0] == "give":
                    conn.send(("item", here.give_away()))
                elif message[0] == "stop":
                    return False
            return True

        while (message := conn.recv())[0] != "stop":
            if message[0] == "give":
                conn.send(("item", None))
                continue
            if message[0] == "initial":
                search.start_at_initial_state()
            else:
                search.start_at(message[1])
            search.walk(time.perf_counter() + message[-1], poll)
            if search.failure is not None:
                conn.send(("failure", search.failure, *report()))
                return
            search.close()
            conn.send(("idle", *report()))
    except Exception as e:  # a harness error, not a divergence: say it in one line
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        if search is not None:
            search.close()
            search.expanded = bytearray()  # the shared bytes may close only once unreferenced
        gc.unfreeze()  # frozen objects are never collected: ttnn ones would outlive exit
        memory.close()

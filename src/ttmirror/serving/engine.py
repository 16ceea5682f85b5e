"""The serving loop: the runner's phases composed into the depth-D pipeline.

One iteration schedules, combines, launches step N+1 and issues its readback, and only then
completes step N's readback and applies it, so at depth 2 the host builds step N+1 before it
knows step N's tokens (the mirror supplies them on device). Stop tokens are checked right after
the apply that delivered them; slots are released as soon as the runner allows.

Subclasses hook in through `_admit` (before each step: which requests enter the runner),
`_before_schedule(rows)` (size the step's prefill chunks) and `_scheduled(q)` (between schedule
and combine: stage what else the step needs); the serving
loop (`batching.py`) uses all three. `drain_on_layout_change` reproduces the TT plugin's policy for
comparison (benchmarks): it retires every step in flight whenever the rows change.

Device faults: a phase whose device call fails leaves the runner as it was (`DeviceFault`); the
engine then fails that step (`Runner.fail_step`): each request with a row in it closes FAILED
with the device's error (`error(req)`), its row in the other in-flight step is dropped, and
the engine goes on serving every other request. Nothing of a failed step is delivered, and its
slot is released as any retired writer's is.

Progress: a loop that serves to the end (`run`, `workload.run_workload`, the soak) watches every
iteration (`Watchdog`) and raises `NoProgress`, one line naming the stuck requests and the
pipeline, after `STALL_LIMIT` iterations in a row that moved nothing while work remained (a
livelock), long before its iteration cap, which stays as the last resort.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ..impl.backend import Backend
from ..impl.drafts import DraftSpec
from ..impl.overrides import NONE, Overrides
from ..impl.probe import ProbeSpec
from ..impl.resolution import SchedulingConfig, resolve
from ..impl.runner import CLOSED, DeviceFault, Runner, RunnerConfig, make_runner

Order = Callable[[list[int]], Sequence[int]]
"""Chooses the row order of a step from the eligible requests (condense/reorder policy)."""
STALL_LIMIT = 3
"""Iterations in a row that move nothing before a loop gives up (`Watchdog`): more than a run
that progresses ever has (depth - 1: retires that deliver nothing, see `Watchdog`)."""
STALLED_SHOWN = 6
"""Open requests a `NoProgress` line names (the rest are counted), so it stays one line."""


class NoProgress(RuntimeError):
    """The serving loop moved nothing for `STALL_LIMIT` iterations in a row with work left."""


@dataclass
class _Waiting:
    prompt: int
    max_tokens: int | None
    stop_ids: frozenset[int]


@dataclass
class EngineConfig:
    async_scheduling: str = "auto"
    rows: int = 8
    slots: int = 2
    max_tokens: int = 16
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    trace: bool = False
    guard: bool = True
    preempt_policy: str = "keep"
    """A preempted request's in-flight tokens: "keep" (vLLM's: delivered; it resumes once it owns
    no placeholder) or "drop" (recomputed after the resume)."""
    logprobs: int = 0
    """Top logprobs per row of the logprob ring (0: none; a serving decoder computes them)."""
    record_events: bool = True
    """The runner records every accepted call as the model's action (`impl/events.py`)."""
    readback_timeout_s: float | None = None
    """How long the host waits for a step's readback before it fails the step (None: forever)."""
    overrides: Overrides = NONE
    """Decision overrides of the runner and its mirror (`impl/overrides.py`; the conformance
    suite plants its bugs so), handed to the runner; none by default."""
    drafts: DraftSpec | None = None
    """Speculative decoding (spec rule 13): K drafts per decoding row, verified on the device;
    async scheduling then needs a draft-aware combine. None = no drafts."""
    subsets: bool = False
    """A foreign scheduler's freedoms (spec rule 14): a step may leave eligible requests out and
    carry fewer drafts on a row (`Runner.schedule(order, drafts)`); False: every eligible
    request in every step, K drafts each."""
    state: str = "ring"
    """Where the tokens the host does not know yet live on the device (spec rule 14): "ring"
    (the previous step's slot) or "rows" (a state row per request; the table holds rows x depth
    of them, as a closed request's row stays held while a step of it is in flight)."""
    drain_on_layout_change: bool = False
    """The TT plugin's policy, for comparison only: before a step whose rows differ from the
    previous step's (arrival, finish, preemption, reorder), retire every step in flight. The
    mirror makes this unnecessary; it costs the overlap."""


class Engine:
    def __init__(
        self, backend: Backend, config: EngineConfig | None = None, order: Order | None = None
    ) -> None:
        self.config = config or EngineConfig()
        self.scheduling: SchedulingConfig = resolve(
            backend, self.config.async_scheduling,
            self.config.drafts.k if self.config.drafts is not None else 0)
        c = self.config
        self.runner: Runner = make_runner(
            backend,
            RunnerConfig(
                depth=self.scheduling.max_concurrent_batches(),
                slots=c.slots,
                rows=c.rows,
                max_tokens=c.max_tokens,
                guard=c.guard,
                probe=c.probe,
                trace=c.trace,
                preempt_policy=c.preempt_policy,
                logprobs=c.logprobs,
                record_events=c.record_events,
                readback_timeout_s=c.readback_timeout_s,
                overrides=c.overrides,
                drafts=c.drafts,
                subsets=c.subsets,
                state=c.state,
                state_rows=c.rows * self.scheduling.max_concurrent_batches()
                if c.state == "rows" else 0,
            ),
        )
        self.order: Order = order or (lambda eligible: eligible)
        self._layout: tuple[int, ...] = ()  # rows of the last scheduled step
        self.stats: Counter[str] = Counter()
        self.runner.allocate()

    def async_scheduling_enabled(self) -> bool:
        return self.scheduling.async_scheduling_enabled()

    def max_concurrent_batches(self) -> int:
        return self.scheduling.max_concurrent_batches()

    @property
    def last_layout(self) -> tuple[int, ...]:
        """The requests of the last scheduled step, in row order."""
        return self._layout

    # --- requests --------------------------------------------------------------------------------
    def submit(
        self, req: int, prompt: int, *, max_tokens: int | None = None, stop_ids: Iterable[int] = ()
    ) -> None:
        """Queue a request; it arrives in the runner once a row is free for it."""
        self.runner.requests.submit(req, _Waiting(prompt, max_tokens, frozenset(stop_ids)))

    def abort(self, req: int) -> None:
        if not self.runner.requests.withdraw(req):
            self.runner.abort(req)

    def stop_ids(self, req: int) -> frozenset[int]:
        """The ids that finish `req` (its engine's record of it, in the request table)."""
        entry = self.runner.requests.entries.get(req)
        stops: frozenset[int] = entry.stop_ids if entry is not None else frozenset()
        return stops

    def preempt(self, req: int) -> None:
        self.runner.preempt(req)

    def resume(self, req: int) -> None:
        self.runner.resume(req)

    def error(self, req: int) -> str | None:
        """Why `req` failed (the device's error for its step), or None."""
        r = self.runner.requests.get(req)
        return None if r is None else r.error

    def delivered(self, req: int) -> list[int]:
        r = self.runner.requests.get(req)
        return list(r.delivered) if r is not None else []

    def idle(self) -> bool:
        r = self.runner
        return not r.requests.queued() and not r.queue and not r.eligible()

    # --- the loop --------------------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration; False when there was nothing to launch or retire."""
        self._admit()
        r = self.runner
        launched = False
        if r.can_schedule():
            rows = list(self.order(r.eligible()))
            if self.config.drain_on_layout_change and r.queue and tuple(rows) != self._layout:
                while r.queue:
                    self._retire_oldest()
                self.stats["drains"] += 1
                rows = list(self.order(r.eligible())) if r.can_schedule() else []
            if rows:
                rows, drafts = self._plan(rows)
                self._before_schedule(rows)
                q = r.schedule(rows, drafts)
                self._layout = tuple(rows)
                fault = self._issue(q)
                if fault is None:
                    launched = True
                else:
                    self._fail(fault)
        retired = bool(r.queue) and (len(r.queue) >= r.depth or not launched)
        if retired:
            self._retire_oldest()
        return launched or retired

    def _issue(self, q: int) -> DeviceFault | None:
        """Stage, combine, launch and issue the readback of the scheduled step q; the device
        fault that stopped it, if one did (the runner is left as the failed phase found it)."""
        r = self.runner
        try:
            with r.device_call("stage", q):
                self._scheduled(q)
            r.combine(q)
            r.launch(q)
            r.readback_issue(q)
        except DeviceFault as fault:
            return fault
        return None

    def _retire_oldest(self) -> None:
        """Complete the oldest step's readback, apply it, stop-check, release what can be."""
        r = self.runner
        try:
            r.readback_complete(0)
        except DeviceFault as fault:
            self._fail(fault)
            return
        tokens = r.apply()
        if r.config.drafts is not None:
            self._stop_check_runs()
        else:
            for req, token in tokens.items():
                # A preempted request's kept token is stop-checked too (it may finish while
                # preempted).
                if token in self.stop_ids(req) and r.status(req) not in CLOSED:
                    r.finish(req)
        self._release_free_slots()

    def _stop_check_runs(self) -> None:
        """With drafts: a stop token anywhere in a run finishes its request there; the run's
        later tokens are cut (as vLLM's per-token stop check cuts them)."""
        r = self.runner
        for req, run in r.last_runs.items():
            stops = self.stop_ids(req)
            at = next((i for i, token in enumerate(run) if token in stops), None)
            if at is not None and r.status(req) not in CLOSED:
                r.finish(req, keep=at + 1)

    def _release_free_slots(self) -> None:
        """Hand back every slot, and with state rows every closed request's state row, that
        nothing in flight holds any more."""
        r = self.runner
        for slot in range(len(r.slots)):
            if r.releasable(slot):
                r.release(slot)
        for idx, owner in enumerate(r.table):
            if owner >= 0 and r.releasable_row(idx):
                r.release_row(idx)

    def _row_free(self) -> bool:
        """An arrival can be given a state row now (always, with the ring)."""
        r = self.runner
        return r.config.state != "rows" or r.requests.free_row() is not None

    def _fail(self, fault: DeviceFault) -> list[int]:
        """The device failed step `fault.q`: its requests fail with the error, the rest go on.
        Returns the failed requests."""
        failed = self.runner.fail_step(fault.q, str(fault))
        self.stats["faults"] += 1
        self.stats[f"faults_at_{fault.phase}"] += 1
        self.stats["failed_requests"] += len(failed)
        self._release_free_slots()
        return failed

    def _plan(self, rows: list[int]) -> tuple[list[int], list[int] | None]:
        """The step's rows and each one's drafts (None: every eligible request with all its
        drafts, which is all this engine does; a serving engine's scheduler takes rule 14's
        freedoms)."""
        return rows, None

    def _before_schedule(self, rows: list[int]) -> None:
        """Hook right before the step over `rows` is scheduled (none here)."""

    def _scheduled(self, q: int) -> None:
        """Hook between schedule and combine: stage what else the step needs (none here)."""

    def run(self, max_iterations: int = 1_000_000) -> None:
        """Step until idle: NoProgress once it moves nothing (`Watchdog`), RuntimeError past
        `max_iterations` (the last resort)."""
        watchdog = Watchdog(self)
        for _ in range(max_iterations):
            if not self.step() and not self.runner.requests.queued():
                return
            watchdog.check()
        raise RuntimeError(f"the engine did not go idle within {max_iterations} iterations")

    # --- progress --------------------------------------------------------------------------------
    def progress(self) -> Hashable:
        """What an iteration that makes progress changes (`Watchdog`): requests admitted, and per
        open request its status, tokens delivered, position (in-flight rows included), prefill
        chunks left and preemptions."""
        r = self.runner
        return len(r.requests), tuple(
            (q, x.status, len(x.delivered), r.next_pos(q), x.prefill_left, x.preemptions)
            for q in r.open_requests() for x in (r.requests[q],)
        )

    def stall(self) -> str:
        """One line: the open requests, how far each got, and the pipeline's state."""
        r = self.runner
        open_ = r.open_requests()
        shown = [self._stalled_request(q) for q in open_[:STALLED_SHOWN]]
        if len(open_) > STALLED_SHOWN:
            shown.append(f"{len(open_) - STALLED_SHOWN} more open")
        waiting = self._not_admitted()
        if waiting:
            shown.append(f"{waiting} not admitted")
        steps = "; ".join(
            f"step {s.index} {s.phase.name} rows "
            + " ".join(f"r{w.req}" + ("(partial)" if w.partial else "")
                       + ("" if w.live else "(dropped)") for w in s.rows)
            for s in r.queue
        )
        slots = ", ".join(
            "free" if not s.written else "released" if s.released else f"step {s.writer}'s"
            for s in r.slots
        )
        return (f"{'; '.join(shown) or 'no open request'} | {len(r.queue)} step(s) in flight"
                f"{': ' + steps if steps else ''} | slots: {slots}")

    def _stalled_request(self, q: int) -> str:
        x = self.runner.requests[q]
        left = f", {x.prefill_left} prefill chunk(s) left" if x.prefill_left else ""
        return (f"r{q} {x.status.name} {len(x.delivered)}/{x.max_tokens} tokens at position "
                f"{self.runner.next_pos(q)}{left}")

    def _not_admitted(self) -> int:
        """Submitted requests the runner has not seen yet."""
        return len(self.runner.requests.queued())

    def close(self) -> None:
        self.runner.close()

    def _admit(self) -> None:
        active = len(self.runner.open_requests())
        for req in self.runner.requests.queued():
            if active >= self.config.rows or not self._row_free():
                return
            w = self.runner.requests.entries[req]
            self.runner.arrive(req, w.prompt, max_tokens=w.max_tokens)
            active += 1


class Watchdog:
    """Stops a serving loop that no longer makes progress (a livelock) with `NoProgress`.

    Progress is observable state, not activity: an iteration makes progress when it changes the
    engine's `progress()` fingerprint: a request admitted; a request's status (scheduled,
    finished, aborted, failed, preempted, resumed, closed); its tokens delivered; its position
    (a step scheduled with a row that will deliver); its prefill (a chunk that advances the
    prompt computed so far, or its runner chunks left); its preemptions. Steps scheduled,
    applied or released count only through what they do to requests, so a step whose chunk
    advances nothing is no progress, and neither is the pipeline's ring turning under it.
    A submission is the driver's input, not the engine's movement; only its admission counts.

    What may legitimately move nothing: a retire whose rows deliver nothing (dropped by finish,
    abort or preemption, or a partial chunk, whose advance was counted when it was staged), at
    most depth - 1 of them in a row, since every step scheduled in a run that progresses moves a
    position or a prefill. No iteration waits on the device without retiring: the retire blocks
    on its readback's event (`Runner.readback_complete`, with the readback timeout failing the
    step), so a slow device makes iterations slow, never empty; an iteration that launched and
    retired nothing found nothing to do with work left. An iteration that leaves the engine idle
    (nothing queued, running or preempted: between arrivals) resets the count.
    """

    def __init__(self, engine: Engine, limit: int = STALL_LIMIT) -> None:
        self.engine, self.limit, self.stalled = engine, limit, 0
        self._last = engine.progress()

    def check(self) -> None:
        """After an iteration: count it if it moved nothing with work left; NoProgress at the
        limit."""
        now = self.engine.progress()
        moved = now != self._last
        self._last = now
        self.stalled = 0 if moved or self.engine.idle() else self.stalled + 1
        if self.stalled >= self.limit:
            raise NoProgress(f"the engine made no progress in {self.stalled} iterations in a "
                             f"row: {self.engine.stall()}")

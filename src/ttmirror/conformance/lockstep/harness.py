"""Model and implementation in lockstep: one move at a time, checked after every move.

This is the runner half of the quickcheck-dynamic split: the model (`model.actions`) decides
what is enabled and what must happen; this module performs the same action on a `Runner` and
checks that the abstraction of the runner equals the model state and that the model's
invariants hold. Three kinds of move:

- ``act``: a model action (enabled in the model); the implementation must accept it;
- ``device``: complete the next command on CQ0 or CQ1 of the emulated device. When that command
  is the one a model effect stands for (the combine's output, a sampler's slot), the data it
  wrote becomes visible to the abstraction (`observe.py`) and must equal what the model says;
- ``refuse``: an action the model says is disabled; the implementation must refuse it with
  `PhaseError` and change nothing (conformance in the other direction).

Every random choice belongs to the caller (Hypothesis or the guided walker); the device runs
under a `ManualScheduler`, so a list of moves replays exactly.

With drafts (spec rule 13) the model's launch chooses each row's accepted count, while the
implementation's follows from its drafter (`Drafter`, a value of the run, like its prompts): the
lockstep predicts it from the reference sequences and the drafter (`predicted`), offers only
that launch (`successors`), and the device data check then confirms what the verification
accepted. Which launches a run can take is therefore chosen with the drafter's agreeing rows
(`conformance/patterns.py`).

Configurations (`CONFIGS`): on the tt backend, ``eager-2cq`` (compute on CQ0, readback on CQ1,
ordered by events), ``eager-1cq`` (everything on CQ0) and ``traced`` (the decode step captured
once per slot at load, replayed by every launch); the cpu backend has one, ``host``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ttmirror.conformance.bugs import model_only
from ttmirror.conformance.lockstep.abstraction import (
    Abstract,
    Context,
    Seen,
    abstract,
    diff,
    project,
    seen_in,
)
from ttmirror.conformance.lockstep.observe import DeviceObserver, HostObserver
from ttmirror.conformance.lockstep.planted import overrides
from ttmirror.conformance.traces.configs import check_config
from ttmirror.conformance.traces.moves import EFFECT, Divergence, Drafter, Move
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.devices import ttnn_for
from ttmirror.impl.drafts import DraftReference, DraftSpec
from ttmirror.impl.probe import ProbeReference, ProbeSpec
from ttmirror.impl.runner import PhaseError, Runner, RunnerConfig, make_runner
from ttmirror.impl.runner import Status as RunnerStatus
from ttmirror.model import actions as A
from ttmirror.model.actions import Action, take
from ttmirror.model.invariants import invariants_for
from ttmirror.model.state import Bounds, Phase, State, Status, initial_state, state_row_count

BACKENDS = ("tt", "cpu")
DROPS = ("finish", "abort", "preempt")
SAMPLERS = ("seeded", "greedy")
"""The probe's samplers: seeded (top-k 2, keyed by request and position) or greedy (argmax)."""


def detached(error: Any) -> Any:
    """`error` without its traceback (nor its causes'), for keeping once it has been caught.

    A divergence's traceback holds the failed run's frames, and they hold its `Lockstep` (whose
    `failure` it is: a cycle), the device and its host tensors. Kept as a report (a replay's
    `Outcome.divergence`, a campaign's recorded failure), it must not keep them alive, to
    interpreter exit at worst. Raising an error again gives it a fresh traceback, so whoever
    catches it last detaches it again.
    """
    seen: set[int] = set()
    link = error
    while isinstance(link, BaseException) and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


def prompts_from(base: int, requests: int, vocab: int = 64) -> tuple[int, ...]:
    """Distinct last-prompt tokens, so no two requests share a reference sequence."""
    return tuple((base + 17 * r) % vocab for r in range(requests))


def permissive(b: Bounds) -> Bounds:
    """The model's finite-instance knobs opened up: what the implementation has no notion of.

    The implementation has no preemption budget and no feature toggles, so an action that the
    model disables only because of them is not one the implementation must refuse.
    """
    return b._replace(finish=True, abort=True, preempt=True, preemptions=1 << 30, condense=True)


def _checked(bounds: Bounds, backend: str, config: str | None, sampling: str) -> str:
    """The lockstep's configuration (default: the backend's first), or a ValueError naming what
    the implementation cannot be set to."""
    if (only := model_only(bounds.release_at, bounds.variant)) is not None:
        raise ValueError(f"the implementation has no switch for the model's {only[0]}; plant "
                         f"the {only[1]} bug instead")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if sampling not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampling!r}; choose one of: {', '.join(SAMPLERS)}")
    return check_config(backend, config)


class Lockstep:
    """A model state and a runner on one backend, moved together."""

    def __init__(
        self,
        bounds: Bounds,
        backend: str = "tt",
        prompts: Sequence[int] = (),
        *,
        refusals: bool = True,
        refused: set[State] | None = None,
        config: str | None = None,
        sampling: str = "greedy",
        sampling_seed: int = 0,
        bug: str | None = None,
        drafter: Drafter | None = None,
        device_process: bool = False,
    ) -> None:
        """`refusals`: after every act, try every model-disabled action on the implementation;
        `refused`: model states whose refusals were already tried (skipped, and added to);
        `config`: one of `CONFIGS[backend]` (default its first); `sampling`: one of
        `SAMPLERS`, the seeded one drawing with `sampling_seed`; `bug`: a planted bug of the
        implementation (`planted.py`), or None; `drafter`: with spec tokens, the
        probe's drafter (default `Drafter()`); `device_process`: the emulated device's queues
        in a device process of their own, each device move one command run there."""
        config = _checked(bounds, backend, config, sampling)
        self.device_process = device_process
        self.sampling = sampling
        self.sampling_seed = sampling_seed
        self.bug = bug
        self.bounds = bounds
        self.backend = backend
        self.config = config
        self.refusals = refusals
        self.refused = refused
        self.prompts = tuple(prompts) or prompts_from(0, bounds.requests)
        if len(self.prompts) != bounds.requests:
            raise ValueError(f"{bounds.requests} requests need {bounds.requests} prompts")
        probe = ProbeSpec(sampling=sampling_seed if sampling == "seeded" else None)
        ref = ProbeReference(probe)
        k = bounds.spec_tokens
        self.drafter = (drafter or Drafter()) if k else None
        drafts = None
        if self.drafter is not None:
            d = self.drafter
            drafts = DraftSpec(k=k, agreement=d.agreement, seed=d.seed,
                               agree=None if d.agree is None else frozenset(d.agree))
        # With drafts a row may verify positions past max tokens (its run is cut there).
        length = bounds.max_tokens + 1 + (k and (bounds.depth + 2) * (k + 1))
        self.references = [
            ref.sequence(p, length, request=r) for r, p in enumerate(self.prompts)
        ]
        self.context = Context(self.prompts, self.references,
                               prefill_chunks=bounds.prefill_chunks, spec=k,
                               drafter=DraftReference(probe, drafts) if drafts else None,
                               state_rows=bounds.state == "rows")
        self.device: Any = None
        self.runner: Runner = make_runner(self._open_backend(backend), RunnerConfig(
            depth=bounds.depth, slots=bounds.slots, rows=max(1, bounds.requests),
            max_tokens=bounds.max_tokens, guard=bounds.guard, probe=probe,
            trace=config == "traced", preempt_policy=bounds.preempt_policy,
            prefill_chunks=bounds.prefill_chunks, overrides=overrides([bug]), drafts=drafts,
            subsets=bounds.subsets, state=bounds.state,
            state_rows=state_row_count(bounds) if bounds.state == "rows" else 0,
        ))
        self.observer: DeviceObserver | HostObserver | None = None
        """Sees device data as it comes into being; None before load, and on a chip."""
        self.state = initial_state(bounds)
        self.moves: list[Move] = []
        self.states: list[State] = []
        """Model state after each move (states[i] follows moves[i])."""
        self.failure: Divergence | None = None
        self._succ: tuple[State, list[tuple[Action, State]]] | None = None
        self._projected: tuple[State, Seen, Abstract] | None = None

    @property
    def observation(self) -> str:
        """What the abstraction can see: device data, or (on a chip) host state only."""
        drafts = (" (with drafts: ids, draft lanes, positions, counts, runs and drafts)"
                  if self.bounds.spec_tokens else "")
        if self.backend == "cpu":
            return ("mirror data on the host: combine output and slot content as each returns"
                    + drafts)
        if self.device is not None and not self.emulated():
            return "host state only: a chip's memory has no view (consumed and content erased)"
        return "device data: combine output and slot content as each command completes" + drafts

    def _open_backend(self, name: str) -> Any:
        if name == "cpu":
            return CpuBackend()
        from ttmirror.conformance.rig import open_rig
        from ttmirror.impl.tt_backend import TtBackend

        # Emulated unless a chip is present; the device advances only when a move says so.
        queues = 1 if self.config == "eager-1cq" else 2
        self.device = open_rig("tiny", queues=queues, process=self.device_process, chip=True)
        return TtBackend(self.device, readback_cq=queues - 1)

    def close(self) -> None:
        if self.observer is not None:
            self.observer.close()
        try:
            self.runner.close()
        finally:
            if self.device is not None:

                ttnn_for(self.device).close_mesh_device(self.device)
                self.device = None

    # --- saving and restoring (the emulated device and the cpu backend) --------------------------
    def snapshot(self) -> bytes:
        """Everything this run is now, the implementation included (runner, mirror, emulated
        memory, queues, events, traces, moves so far), as bytes `restore` makes a run of."""
        if self.device is not None and not self.emulated():
            raise RuntimeError("a chip's state cannot be saved: snapshots need the emulated device")
        if self.failure is not None:
            raise RuntimeError("a failed run is not a state to go on from")
        from ttmirror.emulator.snapshot import snapshot

        return snapshot(self)

    @staticmethod
    def restore(data: bytes, refused: set[State] | None = None) -> Lockstep:
        """A run in the state `snapshot` saved, independent of it and of every other copy;
        `refused` is the process's set of states whose refusals were tried (shared, not copied)."""
        from ttmirror.emulator.snapshot import restore

        ls: Lockstep = restore(data)
        ls.refused = refused
        return ls

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["refused"] = None  # shared by the runs of a process: `restore` hands it back
        return state

    def discard(self) -> None:
        """Drop a run nobody will go on with: its device closes without completing its queues."""
        if self.observer is not None:
            self.observer.close()
        if self.device is not None:
            self.device.discard()
            self.device = None

    # --- what may happen next --------------------------------------------------------------------
    def successors(self) -> list[tuple[Action, State]]:
        """The model's successors that the implementation can take: with drafts, each launch
        only with the accepted counts its verification will produce."""
        if self._succ is None or self._succ[0] is not self.state:
            found = list(A.successors(self.state, self.bounds))
            if self.bounds.spec_tokens:
                found = [(a, t) for a, t in found
                         if a.name != "launch" or a.args[1:] == self.predicted(a.args[0])]
            self._succ = (self.state, found)
        return self._succ[1]

    def predicted(self, q: int) -> tuple[int, ...]:
        """With drafts: per row of step q (combined), the drafts its launch's verification will
        accept: the leading run of proposals the target agrees with, from the row's newest
        token on, at most its scheduled drafts (0 for a row whose inputs are wrong: its
        output is garbage, and the model explores no other count there)."""
        out = []
        for row in self.state.queue[q].rows:
            a = 0
            if row.live and not row.partial and row.spec and A.inputs_right(row):
                while a < row.spec and self.context.right(row.req, row.pos + a):
                    a += 1
            out.append(a)
        return tuple(out)

    def enabled(self, name: str | None = None) -> list[Action]:
        return [a for a, _ in self.successors() if name is None or a.name == name]

    def emulated(self) -> bool:
        from ttmirror.emulator import EmulatedMeshDevice

        return isinstance(self.device, EmulatedMeshDevice)

    def device_ready(self, cq: int) -> bool:
        if not self.emulated():
            return False
        return any(c.cq == cq for c in self.device.ready_commands())

    def refusable(self) -> list[Action]:
        """Actions disabled in the model (even with its finite-instance knobs opened up)."""
        s, b = self.state, self.bounds
        loose = permissive(b)
        todo = tuple(A.eligible(s, b))
        candidates = [Action("allocate"), Action("apply")]
        candidates += [Action("schedule", todo), Action("schedule", todo[:-1])]
        candidates += [Action(n, (r,)) for n in A.REQUEST_ACTIONS for r in range(b.requests)]
        # With drafts a combined step's launch carries the accepted counts: it is enabled.
        combined = {q for q, step in enumerate(s.queue)
                    if b.spec_tokens and step.phase == Phase.COMBINED}
        candidates += [Action(n, (q,)) for n in A.STEP_ACTIONS for q in range(b.depth)
                       if not (n == "launch" and q in combined)]
        candidates += [Action("release", (k,)) for k in range(b.slots)]
        candidates += [Action(A.RELEASE_ROW, (idx,)) for idx in range(len(s.table))]
        out = []
        for a in dict.fromkeys(candidates):
            if a.name == "schedule" and not a.args and todo:
                continue  # an empty order when requests are eligible: same as todo[:-1] below
            if take(s, loose, a) is None:
                out.append(a)
        return out

    # --- moves -----------------------------------------------------------------------------------
    def act(self, action: Action, expected: State | None = None) -> State:
        """Perform an enabled model action on both sides, then check. Returns the new state."""
        step = len(self.moves)
        nxt = expected
        if nxt is None:
            nxt = take(self.state, self.bounds, action)
        self._record(Move("act", action), nxt if nxt is not None else self.state)
        if nxt is None:
            self._fail("not-enabled", f"{action.label()} is disabled in the model", step)
        if action.name == "launch" and self.bounds.spec_tokens and (
                action.args[1:] != self.predicted(action.args[0])):
            self._fail("harness", f"{action.label()}: this run's drafter accepts "
                       f"{self.predicted(action.args[0])}", step)
        later = self._later_rows() if action.name == "apply" else set()
        try:
            self._call(action)
        except PhaseError as e:
            self._fail("refused", f"the implementation refused {action.label()}: {e}", step)
        except Exception as e:  # a hazard report or a crash: both are failures of the impl
            self._fail(_kind(e), f"{action.label()}: {type(e).__name__}: {e}", step)
        assert nxt is not None
        self.state = nxt
        self._acted(action, later)
        self.check(step)
        if self.refusals and (self.refused is None or nxt not in self.refused):
            if self.refused is not None:
                self.refused.add(nxt)
            for disabled in self.refusable():
                self.refuse(disabled, record=False)
            self.check(step)  # once for the batch: each refusal must have changed nothing
        return nxt

    def advance_device(self, cq: int) -> None:
        """Complete the next command on `cq`: a device-side event the model does not see."""
        step = len(self.moves)
        self._record(Move("device", Action("device", (cq,))), self.state)
        try:
            self.device.step(cq)
        except Exception as e:
            self._fail(_kind(e), f"device(cq={cq}): {type(e).__name__}: {e}", step)
        self.check(step)

    def perform(self, move: Move) -> None:
        """Perform one recorded move (what a replay does, move by move)."""
        if move.kind == "act":
            self.act(move.action)
        elif move.kind == "device" and move.action.name == EFFECT:
            self.advance_to_effect(move.action.args[0])
        elif move.kind == "device":
            self.advance_device(move.action.args[0])
        else:
            self.refuse(move.action)

    def effect_ready(self, cq: int) -> bool:
        """A model effect (combine output, sampler write) can be made to exist on `cq` now."""
        observer = self.observer
        return isinstance(observer, DeviceObserver) and observer.next_effect(cq) is not None

    def advance_to_effect(self, cq: int) -> None:
        """Complete `cq`'s commands in order through the next one a model effect stands for."""
        step = len(self.moves)
        self._record(Move("device", Action(EFFECT, (cq,))), self.state)
        assert isinstance(self.observer, DeviceObserver)
        target = self.observer.next_effect(cq)
        if target is None:
            self._fail("harness", f"device(cq={cq}): no effect is reachable on CQ{cq}", step)
        assert target is not None
        try:
            while not target.done:
                self.device.step(cq)
        except Exception as e:
            self._fail(_kind(e), f"device(cq={cq}): {type(e).__name__}: {e}", step)
        self.check(step)

    def refuse(self, action: Action, *, record: bool = True) -> None:
        """A model-disabled action: the implementation must raise PhaseError, changing nothing.

        With `record` False the move enters the trace only if it fails (after every act, each
        disabled action is tried this way: recording them all would bury the trace).
        """
        step = len(self.moves)
        self._record(Move("refuse", action), self.state)
        try:
            self._call(action)
        except PhaseError:
            pass
        except Exception as e:
            self._fail(_kind(e), f"refuse {action.label()}: {type(e).__name__}: {e}", step)
        else:
            self._fail("accepted", f"the implementation accepted {action.label()}, which the "
                       "model disables", step)
        if record:
            self.check(step)
        else:
            self.moves.pop()
            self.states.pop()

    def check(self, step: int) -> None:
        """Abstraction equals the model state, device data included; the invariants hold."""
        observed = self.observer.observed if self.observer is not None else None
        if observed is not None and observed.problems:
            self._fail("device-order", "; ".join(observed.problems), step)
        try:
            view = self.runner.abstract()
            seen = seen_in(view, observed)
            cached = self._projected
            new_state = cached is None or cached[0] is not self.state
            if new_state or cached is None or cached[1] != seen:
                # A device move or a refusal leaves the model state as it was: project it once.
                cached = self._projected = (
                    self.state, seen, project(self.state, seen, self.bounds.spec_tokens))
            expected, got = cached[2], abstract(view, self.context, observed, seen)
        except Exception as e:  # the harness itself broke: never a verdict on the implementation
            self._fail("harness", f"checking: {type(e).__name__}: {e}", step)
            raise  # unreachable: _fail raised
        if expected != got:
            self._fail("state", "; ".join(diff(expected, got, seen, self.bounds.spec_tokens)),
                       step)
        if new_state:
            for inv in invariants_for(self.bounds):
                if not inv.holds(self.state, self.bounds):
                    self._fail("invariant", f"{inv.name} is violated", step)

    def observe(self) -> Abstract:
        """The implementation's abstraction now (what `check` compares with the model)."""
        observed = self.observer.observed if self.observer is not None else None
        view = self.runner.abstract()
        return abstract(view, self.context, observed, seen_in(view, observed))

    def _later_rows(self, after: int = 1) -> set[int]:
        """Requests with a live row in a step after the first `after` (before an apply, those
        it may drop)."""
        return {row.req for step in self.runner.queue[after:] for row in step.rows if row.live}

    def _acted(self, action: Action, later: set[int]) -> None:
        """Keep what turns ids into tokens, and attribute the device work the act issued;
        `later`: before an apply, the requests with a live row after the oldest step."""
        r = self.runner
        if action.name == "allocate":
            if self.backend == "cpu":
                self.observer = HostObserver(r)
            elif self.emulated():
                self.observer = DeviceObserver(r)
        elif action.name == "schedule":
            step = r.queue[-1]
            self.context.layouts[step.index] = tuple((row.req, row.pos) for row in step.rows)
            self.context.partials[step.index] = frozenset(
                i for i, row in enumerate(step.rows) if row.partial)
        elif action.name in DROPS and not (
            action.name == "preempt" and self.bounds.preempt_policy == "keep"
        ):
            self.context.drops.append((action.args[0], r.steps))
        elif action.name == "apply":
            # With drafts a run can reach max tokens with a later row in flight: it drops.
            for req in sorted(later - self._later_rows(0)):
                if r.status(req) == RunnerStatus.FINISHED:
                    self.context.drops.append((req, r.steps))
        elif action.name in ("combine", "launch"):
            step = r.queue[action.args[0]]
            if isinstance(self.observer, DeviceObserver):
                self.observer.issued(step.index)
            elif isinstance(self.observer, HostObserver):
                if action.name == "combine":
                    self.observer.combined(step.index)
                else:
                    self.observer.launched(step.index, step.slot)

    # --- helpers ---------------------------------------------------------------------------------
    def _record(self, move: Move, state: State) -> None:
        self.moves.append(move)
        self.states.append(state)

    def _fail(self, kind: str, message: str, step: int) -> None:
        self.failure = Divergence(kind, message, step)
        raise self.failure

    def _call(self, action: Action) -> None:
        r, args = self.runner, action.args
        match action.name:
            case "allocate":
                r.allocate()
            case "arrive":
                r.arrive(args[0], self.prompts[args[0]], max_tokens=self.bounds.max_tokens,
                         host_sync=A.is_host_sync(self.bounds, args[0]))
            case "schedule":
                r.schedule(list(args), list(action.drafts) if action.drafts else None)
            case "apply":
                r.apply()
            case name if name in (*A.STEP_ACTIONS, *A.REQUEST_ACTIONS, "release", A.RELEASE_ROW):
                getattr(r, name)(args[0])
            case _:
                raise ValueError(f"unknown action {action.name!r}")


def _kind(error: BaseException) -> str:
    from ttmirror.emulator import HazardError

    if isinstance(error, HazardError):
        return f"hazard:{error.hazard.kind}"
    return "crash"


@dataclass
class RunResult:
    """What a finished run did (for coverage and reports)."""

    moves: list[Move] = field(default_factory=list)
    states: list[State] = field(default_factory=list)
    failure: Divergence | None = None


def status_name(s: State, req: int) -> str:
    return Status(s.requests[req].status).name

"""A Hypothesis state machine of the serving loop: the engine a deployment runs, fuzzed.

The lockstep (`machine.py`) drives the runner with the probe under small bounds; this machine
drives the `ServingEngine` itself, at depth 2 on the emulated TT device (hazards raised), the way
traffic does: requests arrive with random prompts, budgets, stop sets and sampling parameters,
the KV budget preempts, users abort, the device fails a call now and then (spec rule 12), and
the device completes commands in an order set by per-command device times (`TimedScheduler`,
the threaded scheduler's times on a seeded clock). After each run, two oracles:

- the run's recorded events validate against the model (`validate.py`), event by event, faults
  included;
- the tokens equal a sync (depth 1, fault-free) run of the same workload, request by request; a
  request a fault failed has a prefix of them, and carries the device's error.

Aborts are tied to a request's progress (after its n-th token), as in `workload.py`, so the
depth-1 run aborts at the same token. A validation failure writes the run's events as an ITF
trace (`ttmirror validate FILE` shows the divergence); Hypothesis prints the rules that replay it.
`Tally` counts what the runs really did, so a green campaign is known not to be vacuous.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from ttmirror.conformance.lockstep.planted import overrides
from ttmirror.conformance.rig import open_rig, serving_engine
from ttmirror.conformance.traces.itf import write_events
from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.emulator import SeededScheduler, TimedScheduler
from ttmirror.impl.devices import ttnn_for
from ttmirror.impl.events import Event
from ttmirror.impl.runner import CLOSED, Status
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.engine import Watchdog
from ttmirror.serving.models import DecoderModel, load_model
from ttmirror.serving.workload import Outcome, RequestPlan, due_for_abort, outcome_of, run_workload

MODELS = ("probe", "tiny-qwen3")
ROWS = 4
MAX_REQUESTS = 8
MAX_PROMPT = 6
MAX_TOKENS = 10
SEED = 23
COMMANDS = ("decoder_forward", "sampling", "cpu", "copy_host_to_device_tensor", "gather", "where")
"""Commands whose device time the machine draws (others take the scheduler's default)."""
SAMPLINGS: tuple[SamplingParams | None, ...] = (
    None, SamplingParams(), SamplingParams(seed=SEED + 1, top_k=4, temperature=0.7),
    SamplingParams(seed=SEED + 2, top_k=16, top_p=0.5),
)
"""A request's own sampling: the engine's (seeded), greedy, and two seeded settings."""
ABORT_PERCENT = 25
FAULT_PERCENT = 10
"""A fault rule arms a device fault at this rate (else it steps), so most runs meet one or none."""
FAULT_CALLS = ("write", "op", "event", "read", "execute_trace")
"""The device calls a fault rule may make fail (a refused trace replay only fires when traced)."""
TRACE_DIR = "TTMIRROR_TRACE_DIR"
"""Where a run that left the model is written (default: the system's temporary directory)."""

_models: dict[str, DecoderModel] = {}


def _model(name: str) -> DecoderModel:
    if name not in _models:
        _models[name] = load_model(name)
    return _models[name]


@dataclass
class Tally:
    """What the campaign's runs really did (shared by every example of one campaign)."""

    runs: int = 0
    seen: Counter[str] = field(default_factory=Counter)

    def add(self, out: Outcome, events: list[Event], plan: list[RequestPlan]) -> None:
        self.runs += 1
        s = out.stats
        self.seen["events"] += len(events)
        for name in ("overlapped_launches", "mirror_rows", "kv_preemptions", "preempt_in_flight",
                     "abort_in_flight", "finish_in_flight", "partial_rows",
                     "kv_mixed_sampling_steps", "faults", "failed_requests", "fault_in_flight"):
            self.seen[name] += s.get(name, 0)
        self.seen["stopped"] += len(out.stopped(plan))


def _open(model: DecoderModel, seed: int, times: dict[str, float] | None) -> Any:
    scheduler = (lambda: TimedScheduler(times, seed)) if times is not None else (
        lambda: SeededScheduler(seed))
    return open_rig("serving", scheduler=scheduler, model=model, model_rows=ROWS)


class ServingLoop(RuleBasedStateMachine):
    """Arrivals, aborts and engine steps as rules; the whole run checked at teardown."""

    tally = Tally()
    bug: str | None = None
    """A planted bug of every run's runner (`planted.py`); the kill twin sets it."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: ServingEngine | None = None
        self.device: Any = None
        self.plan: dict[int, RequestPlan] = {}
        self.iteration = 0
        self.aborted: set[int] = set()

    @initialize(
        model=st.sampled_from(MODELS),
        kv_tokens=st.sampled_from((None, 12, 16)),
        policy=st.sampled_from(("keep", "drop")),
        prefill_chunk=st.sampled_from((None, 2)),
        trace=st.booleans(),
        seed=st.integers(0, 2**16 - 1),
        times=st.fixed_dictionaries({name: st.sampled_from((0.0, 0.5, 2.0, 6.0))
                                     for name in COMMANDS}),
    )
    def load(self, model: str, kv_tokens: int | None, policy: str, prefill_chunk: int | None,
             trace: bool, seed: int, times: dict[str, float]) -> None:
        self.model_name, self.seed, self.times = model, seed, times
        self.config = ServingConfig(rows=ROWS, kv_tokens=kv_tokens, preempt_policy=policy,
                                    prefill_chunk=prefill_chunk, trace=trace,
                                    overrides=overrides([self.bug]))
        self.engine, self.device = self._engine("auto", seed, times)
        assert self.engine.max_concurrent_batches() == 2, "async scheduling did not engage"

    def _engine(self, scheduling: str, seed: int, times: dict[str, float] | None) -> Any:
        model = _model(self.model_name)
        device = _open(model, seed, times)
        config = ServingConfig(**{**self.config.__dict__, "async_scheduling": scheduling})
        return serving_engine(device, model, config, SamplingParams(seed=SEED)), device

    # --- rules ----------------------------------------------------------------------------------
    @precondition(lambda self: len(self.plan) < MAX_REQUESTS)
    @rule(prompt=st.lists(st.integers(0, 2**16), min_size=1, max_size=MAX_PROMPT),
          max_tokens=st.integers(1, MAX_TOKENS), stop=st.booleans(),
          sampling=st.sampled_from(range(len(SAMPLINGS))))
    def arrive(self, prompt: list[int], max_tokens: int, stop: bool, sampling: int) -> None:
        assert self.engine is not None
        vocab = _model(self.model_name).vocab
        req = len(self.plan)
        kv = self.config.kv_tokens
        if kv is not None:  # what the KV budget can ever hold (else the engine refuses it)
            max_tokens = min(max_tokens, kv + 1 - len(prompt))
        p = RequestPlan(
            req=req, arrival=self.iteration, prompt=tuple(t % vocab for t in prompt),
            max_tokens=max_tokens,
            # A quarter of the vocabulary: some request really stops early.
            stop_ids=frozenset(range(req % 4, vocab, 4)) if stop else frozenset(),
            sampling=SAMPLINGS[sampling],
        )
        self.plan[req] = p
        self.engine.submit(p.req, p.prompt, max_tokens=p.max_tokens, stop_ids=p.stop_ids,
                           sampling=p.sampling)

    @precondition(lambda self: any(self._abortable(r) for r in self.plan))
    @rule(data=st.data(), chance=st.integers(0, 99))
    def abort(self, data: st.DataObject, chance: int) -> None:
        """Abort a request after its newest token (or, with none yet, after its first); at a
        quarter of the other rules' rate (else a step), so requests live long enough to be
        preempted."""
        assert self.engine is not None
        if chance >= ABORT_PERCENT:
            self.step()
            return
        req = data.draw(st.sampled_from([r for r in self.plan if self._abortable(r)]))
        got = len(self.engine.delivered(req))
        self.plan[req] = RequestPlan(**{**self.plan[req].__dict__, "abort_after": max(got, 1)})
        self._abort_due()

    @precondition(lambda self: self.device is not None and not self.device.faults.armed)
    @rule(call=st.sampled_from(FAULT_CALLS), skip=st.integers(0, 3), chance=st.integers(0, 99))
    def fault(self, call: str, skip: int, chance: int) -> None:
        """Arm one device fault: the (skip+1)-th next call of that kind raises (rule 12); at a
        tenth of the other rules' rate (else a step), so most runs meet one fault or none."""
        if chance >= FAULT_PERCENT:
            self.step()
            return
        self.device.faults.arm(call, skip=skip)

    @rule()
    def step(self) -> None:
        assert self.engine is not None
        self.engine.step()
        self.iteration += 1
        self._abort_due()

    # --- the run's end and its oracles -----------------------------------------------------------
    def teardown(self) -> None:
        if self.engine is None:
            return
        try:
            watchdog = Watchdog(self.engine)  # a livelock fails in a few steps, not 10,000
            while not self.engine.idle():
                self.step()
                watchdog.check()
                if self.iteration > 10_000:
                    raise AssertionError("the engine did not go idle within 10,000 iterations")
            events = list(self.engine.runner.events.events)
            out = outcome_of(self.engine, self.iteration, 0.0, self.aborted)
            out.stats["faults"] = self.engine.stats["faults"]
        finally:
            self.engine.close()
            ttnn_for(self.device).close_mesh_device(self.device)
        self._check(out, events)

    def _check(self, out: Outcome, events: list[Event]) -> None:
        d = validate(events, bounds_of(events))
        if d is not None:
            path = _write(events)
            raise AssertionError(f"{d.line()}; the run's events: {path} "
                                 f"(ttmirror validate {path})")
        plan = list(self.plan.values())
        engine, device = self._engine("off", self.seed, None)
        try:
            sync = run_workload(engine, plan)
            d = validate(engine.runner.events.events, bounds_of(engine.runner.events.events))
            assert d is None, f"the sync run: {d.line()}"
        finally:
            engine.close()
            ttnn_for(device).close_mesh_device(device)
        for p in plan:
            got, want = out.tokens.get(p.req, []), sync.tokens.get(p.req, [])
            if p.req in out.errors:  # failed by a device fault: what it got, it was owed
                assert out.statuses[p.req] == Status.FAILED and got == want[: len(got)], (
                    f"request {p.req} failed ({out.errors[p.req]}) with {got}, not a prefix of "
                    f"depth 1's {want}")
                continue
            assert got == want, (
                f"request {p.req}: depth 2 delivered {got}, depth 1 {want}")
        self.tally.add(out, events, plan)

    # --- helpers --------------------------------------------------------------------------------
    def _abortable(self, req: int) -> bool:
        if self.engine is None or self.plan[req].abort_after is not None:
            return False
        return self.engine.runner.status(req) not in CLOSED

    def _abort_due(self) -> None:
        """Abort each request that has its planned tokens, as `run_workload` does."""
        assert self.engine is not None
        for req in due_for_abort(self.engine, self.plan, self.aborted):
            self.engine.abort(req)
            self.aborted.add(req)


FAILURE = "serving-loop-failure.itf.json"


def _write(events: list[Event]) -> Path:
    """The run's events as an ITF trace, in $TTMIRROR_TRACE_DIR (else the temporary directory)."""
    folder = Path(os.environ.get(TRACE_DIR) or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    # One name: Hypothesis replays the shrunk example last, so the file left is the minimal run.
    path = folder / FAILURE
    write_events(events, path)
    return path

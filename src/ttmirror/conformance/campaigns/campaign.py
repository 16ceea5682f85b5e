"""One Hypothesis campaign of the state machine: run it, time it, keep the shrunk failure.

Every failure is written as an ITF trace into the directory the caller names; the result says
where, with the seed, so a failure is its seed plus its trace and replays exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from ttmirror.conformance.lockstep.harness import Divergence, detached
from ttmirror.conformance.lockstep.machine import (
    EdgeSink,
    FailedRun,
    OutOfTime,
    Recorder,
    machine,
)
from ttmirror.conformance.traces import itf
from ttmirror.conformance.traces.configs import CONFIGS
from ttmirror.model.state import Bounds


@dataclass
class Campaign:
    backend: str
    config: str
    bug: str | None
    seed: int | None
    examples: int
    steps: int
    seconds: float
    failed: bool
    error: str | None = None
    first_failure_examples: int | None = None
    first_failure_seconds: float | None = None
    trace_len: int | None = None
    """Moves in the shrunk failing trace."""
    trace_path: Path | None = None
    failing: FailedRun | None = None
    """The last (shrunk, when Hypothesis shrank) failing run."""
    observation: str = ""
    """What the abstraction could see: device data, or (on a chip) host state only."""
    out_of_time: bool = False
    """The deadline ended generation or shrinking; a failure is the smallest found by then."""


def run(
    bounds: Bounds,
    backend: str,
    base: settings,
    *,
    seed: int | None = None,
    bug: str | None = None,
    trace_dir: Path | None = None,
    on_run: EdgeSink | None = None,
    max_examples: int | None = None,
    config: str | None = None,
    deadline: float | None = None,
    database: ExampleDatabase | None = None,
) -> Campaign:
    """Run the state machine under `base` settings (a profile) with `bug` planted, stopping at
    `deadline` (a `time.perf_counter()` value) if it comes first; `database` (default the
    profile's) is where Hypothesis replays stored examples from first and saves new ones."""
    config = config or CONFIGS[backend][0]
    recorder = Recorder(on_run=on_run, deadline=deadline)
    cls = machine(bounds, backend, recorder, config, bug)
    overrides: dict[str, object] = {"verbosity": Verbosity.quiet}
    if seed is not None:
        overrides["derandomize"] = False
        cls = hypothesis_seed(seed)(cls)
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    if database is not None:
        overrides["database"] = database
    start = time.perf_counter()
    error: BaseException | None = None
    out_of_time = False
    try:
        run_state_machine_as_test(cls, settings=settings(base, **overrides))  # type: ignore[arg-type]
    except OutOfTime:
        pass
    except Exception as e:  # the shrunk failure, re-raised by Hypothesis
        error = detached(e)  # it is the recorded failure's: re-raised, it holds frames again
    if recorder.expired:
        # Cut short, while generating or shrinking: the failing run that failed soonest (if any)
        # is the failure to report.
        out_of_time = True
        recorder.last_failure = recorder.smallest_failure
        error = None if recorder.last_failure is None else recorder.last_failure.error
    seconds = time.perf_counter() - start
    result = Campaign(backend, config, bug, seed, recorder.examples, recorder.steps, seconds,
                      failed=error is not None, error=None if error is None else str(error),
                      first_failure_examples=recorder.first_failure_examples,
                      first_failure_seconds=recorder.first_failure_seconds)
    failure = recorder.last_failure
    result.observation = recorder.observation
    result.out_of_time = out_of_time
    result.failing = failure if error is not None else None
    if error is not None and failure is not None:
        result.trace_len = len(failure.moves)
        if trace_dir is not None:
            name = f"{bug or 'conformance'}-{backend}-{config}"
            name += f"-seed{seed}" if seed is not None else ""
            err = failure.error if isinstance(failure.error, Divergence) else None
            trace = itf.to_itf(bounds, backend, failure.prompts, failure.moves, failure.states,
                               failure=err, bug=bug, seed=seed, config=config,
                               sampling=failure.sampling, sampling_seed=failure.sampling_seed,
                               drafter=failure.drafter)
            result.trace_path = itf.write(Path(trace_dir) / f"{name}.itf.json", trace)
    return result

"""Device faults mid-pipeline lose nothing (spec rule 12): one test per fault kind, the device
closed under the engine, an allocation refused at load, atomic phases, and the fault half's
planted bugs. The scenarios and the promise they check live in `conformance/fault_runs.py`."""

from __future__ import annotations

import gc
import multiprocessing
import random

import pytest

from ttmirror.conformance import bugs
from ttmirror.conformance.kills import fault_half as fault_runs
from ttmirror.conformance.kills.fault_half import KINDS, faulted_run, promise_errors, sync_tokens
from ttmirror.impl.runner import DeviceFault, Status
from ttmirror.serving.workload import run_workload

ARMED = [k for k, kind in KINDS.items() if kind.call not in ("lost", "killed")]
"""The scenarios whose fault is one armed call (not the whole device gone)."""


@pytest.mark.parametrize("name", ARMED)
def test_a_fault_loses_nothing(name: str) -> None:
    run = faulted_run(name)
    assert promise_errors(run) == []
    # One fault, met in the phase it was armed for.
    phase = KINDS[name].phase
    assert run.faults == 1 and run.out.stats[f"engine_faults_at_{phase}"] == 1


@pytest.mark.parametrize("name", ARMED)
def test_a_fault_with_drafts_in_flight_loses_nothing(name: str) -> None:
    # With two drafts per decoding row: the failed requests keep a prefix of what plain sync
    # decoding gives them, every other request all of it (an aborted one up to K tokens more,
    # its abort landing after a run), nothing hazards or leaks, and the run validates (a step
    # failed before its readback never told the host its verdicts: the model takes none).
    run = fault_runs.faulted_run(name, spec_tokens=2)
    owed, out = sync_tokens(), run.out
    failed = {r for r, s in out.statuses.items() if s == Status.FAILED}
    assert failed and run.faults == 1 and run.hazards == 0 and run.live == run.baseline
    for r, tokens in out.tokens.items():
        n = min(len(tokens), len(owed[r]))
        assert tokens[:n] == owed[r][:n], r
        if r not in failed and out.statuses[r] != Status.ABORTED:
            assert tokens == owed[r], r
    assert run.out.stats.get("drafted_rows", 0) > 0
    if KINDS[name].phase.startswith("readback"):  # a launched step whose verdict never came
        assert any(e.action == "fault" and e.get("phase") in ("launched", "readback_issued")
                   for e in run.events)
    assert [e for e in promise_errors(run) if "left the model" in e] == []


def test_a_device_closed_under_the_engine_fails_the_open_requests_and_keeps_their_tokens() -> None:
    run = faulted_run("device-closed")
    assert promise_errors(run) == []
    failed = {r for r, s in run.out.statuses.items() if s == Status.FAILED}
    assert len(failed) >= 2 and all("closed" in run.out.errors[r] for r in failed)
    # Some requests had closed before the device went: they keep all they were owed.
    assert any(s == Status.FINISHED for s in run.out.statuses.values())


KILL_AT = sorted(random.Random(12).sample(range(2, 22), 4))
"""Engine iterations after which the device process is killed: seeded points of the run that
leave steps still to launch (the workload takes 24 iterations, launching in the first 23).
Killed after the last launch, the device may have finished all it was sent, depending on the
machine's speed: then no request fails, rightly, and the verdict would depend on timing."""


@pytest.mark.parametrize("arm_at", KILL_AT)
def test_a_killed_device_process_fails_the_open_requests_and_keeps_their_tokens(
        arm_at: int) -> None:
    """The emulated device's process killed mid-run is a device fault (spec rule 12): the
    requests still open fail with the device's error, keeping a prefix of their sync tokens,
    those that closed before keep all, nothing is duplicated, no buffer leaks, the run validates,
    and no device process is left behind."""
    before = {p.pid for p in multiprocessing.active_children()}
    run = faulted_run("device-process-killed", arm_at=arm_at)
    assert promise_errors(run) == []
    failed = {r for r, s in run.out.statuses.items() if s == Status.FAILED}
    assert failed and all("process ended" in run.out.errors[r] for r in failed)
    assert any(s == Status.FINISHED for s in run.out.statuses.values())
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_an_allocation_failure_at_load_is_one_clear_error_and_frees_what_it_took() -> None:
    device = fault_runs.open_emulated()
    tt = device.api
    try:
        baseline = len(device.allocator.live)
        device.faults.arm("allocate", skip=3)  # some of load's tensors exist by then
        with pytest.raises(DeviceFault, match=r"^allocate: TT_THROW") as caught:
            fault_runs.engine_on(device)
        assert caught.value.__cause__ is None and caught.value.__context__ is None
        del caught
        gc.collect()
        assert len(device.allocator.live) == baseline
        # The device is still usable: a second load succeeds and serves.
        engine = fault_runs.engine_on(device)
        out = run_workload(engine, fault_runs.plan())
        engine.close()
        assert out.tokens == sync_tokens()
    finally:
        tt.close_mesh_device(device)


def test_a_refused_phase_changes_nothing_in_the_runner() -> None:
    """Atomic submission: a phase whose device call fails leaves the runner exactly as it was
    (its view, counters and events), so the engine alone decides what the fault costs."""
    device = fault_runs.open_emulated()
    tt = device.api
    try:
        engine = fault_runs.engine_on(device)
        r = engine.runner
        engine.submit(0, (1, 2, 3), max_tokens=4)
        engine.submit(1, (4, 5), max_tokens=4)
        engine.step()
        engine.step()  # a step in flight, another applied: the slots are in use
        q = r.schedule(r.eligible())
        for phase, call in (("combine", lambda: r.combine(q)), ("launch", lambda: r.launch(q)),
                            ("readback_issue", lambda: r.readback_issue(q))):
            before = (r.abstract(), dict(r.stats), len(r.events))
            device.faults.arm({"combine": "op", "launch": "op", "readback_issue": "read"}[phase])
            with pytest.raises(DeviceFault, match=f"^{phase}"):
                call()
            assert (r.abstract(), dict(r.stats), len(r.events)) == before
            call()  # the same call, with the device well, goes through
        r.fail_step(q, "given up")
        engine.close()
    finally:
        tt.close_mesh_device(device)


@pytest.mark.parametrize("bug", sorted(bugs.FAULT_HANDLING_BUGS))
def test_the_fault_half_kills_each_planted_fault_handling_bug(bug: str) -> None:
    killed, verdict = fault_runs.kill(bug)
    assert killed, f"{bug} survived the fault half"
    assert verdict.layer in ("model", "hazard", "device data", "crash")


def test_the_fault_half_passes_without_a_bug() -> None:
    """The twin of the kills: with nothing planted every scenario keeps the promise (so a kill
    above is the bug's doing)."""
    ran: list[tuple[str, bool]] = []
    verdict = fault_runs.check(on_run=lambda run: ran.append((run.kind, run.logprobs)))
    assert verdict.layer is None, verdict.message
    # Every scenario, without logprobs and then with them.
    assert ran == [(k, lp) for lp in fault_runs.LOGPROB_RUNS for k in KINDS]


def test_the_logprob_fence_dies_only_where_a_timed_out_readback_meets_logprobs() -> None:
    """The planted `logprob-fence-ids-only` (the logprob copies under their own event, the
    slot's rewrite fence covering the ids only) is harmless while the host waits on every
    readback: only a readback the host gave up on, with logprobs on, lets the next launch
    write what the copy still reads."""
    bug = "logprob-fence-ids-only"
    for kind in KINDS:
        if kind != "readback-timeout":
            v = fault_runs.check([kind], bug=bug)
            assert v.layer is None, (kind, v.message)
    plain = fault_runs.faulted_run("readback-timeout", bug=bug)
    assert promise_errors(plain) == []
    killed, verdict = fault_runs.kill(bug)
    assert killed and verdict.layer == "hazard", verdict
    assert verdict.message is not None and verdict.message.startswith(
        "readback-timeout with logprobs: [write-after-read]")


def test_mutants_lists_the_fault_half_kills() -> None:
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "mutants", "--bug", "fault-keeps-ring-position",
         "--json"], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "LOGURU_LEVEL": "WARNING"})
    assert done.returncode == 0, done.stderr[-2000:]
    (kill,) = json.loads(done.stdout)
    assert kill["id"] == "fault-keeps-ring-position" and kill["killed"] and kill["by"] == "faults"


def test_an_event_recorded_inside_a_device_call_that_raised_is_forgotten() -> None:
    """A recorded event means its action happened: what a phase recorded inside its device call
    is dropped when the call raises (the twin, recording outside the call, is the planted
    `event-before-device-call`, killed above by validation)."""
    device = fault_runs.open_emulated()
    tt = device.api
    try:
        r = fault_runs.engine_on(device).runner
        before = len(r.events)
        with (pytest.raises(DeviceFault, match=r"^launch\(q=0\): TT_THROW"),
              r.device_call("launch", 0)):
            r.events.record("launch", (0,), phase="launched")
            assert len(r.events) == before + 1
            raise RuntimeError("TT_THROW: refused")
        assert len(r.events) == before
        with r.device_call("launch", 0):  # a call that returns keeps what it recorded
            r.events.record("launch", (0,), phase="launched")
        assert len(r.events) == before + 1
        r.close()
    finally:
        tt.close_mesh_device(device)

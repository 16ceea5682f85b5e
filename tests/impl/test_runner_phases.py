"""Each runner phase enforces the model's precondition, refuses without changing anything, and
`abstract()` shows the state an abstraction function maps onto the model's."""

from __future__ import annotations

import pytest

from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.runner import (
    Phase,
    PhaseError,
    Runner,
    RunnerConfig,
    SlotBusyError,
    Status,
)
from ttmirror.impl.tt_backend import TtBackend


def loaded(depth: int = 2, slots: int = 2, backend: object = None, **config: object) -> Runner:
    runner = Runner(backend or CpuBackend(),  # type: ignore[arg-type]
                    RunnerConfig(depth=depth, slots=slots, rows=4, **config))  # type: ignore[arg-type]
    runner.allocate()
    return runner


def launch_step(runner: Runner, order: list[int] | None = None) -> int:
    q = runner.schedule(order)
    runner.combine(q)
    runner.launch(q)
    runner.readback_issue(q)
    return q


def retire(runner: Runner) -> dict[int, int]:
    runner.readback_complete(0)
    return runner.apply()


def refused(runner: Runner, call: object, match: str) -> None:
    """The call raises PhaseError and leaves the runner exactly as it was."""
    before = runner.abstract()
    with pytest.raises(PhaseError, match=match):
        call()  # type: ignore[operator]
    assert runner.abstract() == before


def test_nothing_runs_before_allocate() -> None:
    runner = Runner(CpuBackend())
    with pytest.raises(PhaseError, match="allocate"):
        runner.arrive(0, 1)
    with pytest.raises(PhaseError, match="allocate"):
        runner.schedule()
    runner.allocate()
    with pytest.raises(PhaseError, match="once"):
        runner.allocate()


def test_schedule_needs_room_and_every_eligible_request_once() -> None:
    runner = loaded()
    refused(runner, runner.schedule, "no request is eligible")
    runner.arrive(0, 5)
    runner.arrive(1, 6)
    refused(runner, lambda: runner.schedule([0]), "every eligible request")
    refused(runner, lambda: runner.schedule([0, 0, 1]), "every eligible request")
    launch_step(runner, [1, 0])
    launch_step(runner, [0, 1])
    refused(runner, runner.schedule, "depth is 2")


def test_combine_waits_for_the_previous_launch_and_apply_for_the_readback() -> None:
    runner = loaded()
    runner.arrive(0, 5)
    q0 = runner.schedule()
    q1 = runner.schedule()
    refused(runner, lambda: runner.combine(q1), "launch it first")
    runner.combine(q0)
    refused(runner, lambda: runner.combine(q1), "launch it first")
    runner.launch(q0)
    runner.combine(q1)  # the twin: legal once step 0's sampler wrote its slot
    refused(runner, runner.apply, "not complete")
    runner.readback_issue(q0)
    refused(runner, runner.apply, "not complete")
    refused(runner, lambda: runner.readback_complete(q1), "needs READBACK_ISSUED")
    assert retire(runner) == {0: runner.requests[0].delivered[0]}


def test_release_waits_for_the_writer_to_retire_and_the_next_combine() -> None:
    runner = loaded()
    runner.arrive(0, 5)
    refused(runner, lambda: runner.release(0), "never written")
    launch_step(runner)
    refused(runner, lambda: runner.release(0), "writer, step 0, has not been applied")
    q1 = runner.schedule()
    retire(runner)  # step 0 retired, but step 1 still has to combine from slot 0
    refused(runner, lambda: runner.release(0), "combine still reads it")
    runner.combine(q1 - 1)
    runner.release(0)
    refused(runner, lambda: runner.release(0), "already released")
    assert runner.abstract().slots[0].released


def test_request_events_check_status() -> None:
    runner = loaded()
    runner.arrive(0, 5)
    refused(runner, lambda: runner.arrive(0, 5), "already arrived")
    refused(runner, lambda: runner.preempt(0), "only RUNNING")
    refused(runner, lambda: runner.finish(0), "stop-checked")
    refused(runner, lambda: runner.resume(0), "not PREEMPTED")
    launch_step(runner)
    refused(runner, lambda: runner.finish(0), "stop-checked")  # nothing delivered yet
    retire(runner)
    runner.finish(0)  # right after the apply that delivered the stop token
    refused(runner, lambda: runner.abort(0), "already FINISHED")
    refused(runner, lambda: runner.finish(7), "never arrived")


def test_abstract_shows_the_previous_row_map_and_dropped_rows() -> None:
    runner = loaded(preempt_policy="drop")
    for req in (0, 1, 2):
        runner.arrive(req, 10 + req)
    launch_step(runner, [0, 1, 2])
    launch_step(runner, [2, 0, 1])  # reordered: each row reads its request's previous row
    view = runner.abstract()
    first, second = view.queue
    assert (first.n, first.slot, first.src_slot) == (0, 0, None)
    assert (second.n, second.slot, second.src_slot) == (1, 1, 0)
    assert [(r.req, r.pos, r.prev_row, r.live) for r in second.rows] == [
        (2, 1, 2, True),
        (0, 1, 0, True),
        (1, 1, 1, True),
    ]
    assert view.next_slot == 0 and second.phase == Phase.READBACK_ISSUED
    runner.abort(1)  # in flight in both steps: both rows dropped, nothing delivered
    assert [r.live for s in runner.abstract().queue for r in s.rows].count(False) == 2
    retire(runner)
    view = runner.abstract()
    assert view.requests[1].status == Status.ABORTED and view.requests[1].delivered == ()
    assert view.requests[1].closed_at == 0
    assert len(view.requests[0].delivered) == 1 and view.requests[0].unchecked
    with pytest.raises(TypeError):
        view.requests[5] = view.requests[0]  # type: ignore[index]
    runner.preempt(0)  # its step-1 row is stale now; on resume it restarts from host ids
    runner.resume(0)
    retire(runner)
    q = runner.schedule([0, 2])
    assert [r.prev_row for r in runner.abstract().queue[q].rows] == [None, None]


def test_keep_delivers_a_preempted_token_and_resumes_without_placeholders() -> None:
    runner = loaded(max_tokens=4)  # keep is the default
    runner.arrive(0, 10)
    launch_step(runner)
    launch_step(runner)
    runner.preempt(0)
    assert all(r.live for s in runner.abstract().queue for r in s.rows)  # nothing dropped
    refused(runner, lambda: runner.resume(0), "placeholder")
    assert 0 in retire(runner) and runner.status(0) == Status.PREEMPTED
    refused(runner, lambda: runner.resume(0), "placeholder")  # the second step still owes one
    retire(runner)
    assert len(runner.requests[0].delivered) == 2 and runner.stats["preempted_delivered"] == 2
    runner.resume(0)
    q = runner.schedule()
    row = runner.abstract().queue[q].rows[0]
    assert (row.pos, row.prev_row) == (2, None)  # re-prefill from host ids, nothing owed


def test_partial_prefill_rows_are_never_mirrored_nor_delivered() -> None:
    runner = loaded(prefill_chunks=2)
    runner.arrive(0, 10)
    launch_step(runner)
    q = launch_step(runner)
    first, last = (s.rows[0] for s in runner.abstract().queue)
    assert first.partial and not last.partial and (last.pos, last.prev_row) == (0, None)
    assert runner.abstract().queue[q].src_slot is None
    assert retire(runner) == {}  # the partial row's id is discarded
    assert list(retire(runner)) == [0] and len(runner.requests[0].delivered) == 1


def test_chunk_prefill_sizes_chunks_per_step_and_refuses_a_placeholder() -> None:
    # A serving loop with a token budget says before each schedule whether the row is partial.
    runner = loaded()
    runner.arrive(0, 10)
    for _ in range(2):
        runner.chunk_prefill(0, partial=True)
        launch_step(runner)
        if len(runner.queue) == 2:
            assert retire(runner) == {}  # the first partial row: nothing delivered
    runner.chunk_prefill(0, partial=False)
    launch_step(runner)
    rows = [s.rows[0] for s in runner.abstract().queue]
    assert [r.partial for r in rows] == [True, False] and rows[1].prev_row is None
    assert retire(runner) == {} and list(retire(runner)) == [0]
    launch_step(runner)  # a decode: its token is in flight, the host table holds a placeholder
    refused(runner, lambda: runner.chunk_prefill(0, partial=True), "placeholder")
    runner.arrive(1, 11)
    runner.abort(1)
    refused(runner, lambda: runner.chunk_prefill(1, partial=True), "ABORTED")


def test_host_sync_request_waits_for_its_step_in_flight() -> None:
    runner = loaded()
    runner.arrive(0, 10, host_sync=True)
    runner.arrive(1, 11)
    launch_step(runner)
    assert runner.eligible() == [1]
    q = launch_step(runner)
    assert [r.req for r in runner.abstract().queue[q].rows] == [1]
    assert runner.stats["host_sync_held"] == 1
    retire(runner)
    assert 0 in runner.eligible()


def test_a_slot_is_not_rewritten_while_its_readback_is_outstanding(tt: TtBackend) -> None:
    runner = loaded(depth=2, slots=1, backend=tt)  # K=1 < depth: the ring is too small
    runner.arrive(0, 5)
    launch_step(runner)
    q1 = runner.schedule()
    runner.combine(q1)
    with pytest.raises(SlotBusyError, match="step 0's readback outstanding"):
        runner.launch(q1)
    runner.readback_complete(0)  # the twin: once the readback is done the rewrite is legal
    runner.launch(q1)
    runner.apply()
    runner.readback_issue(0)
    runner.readback_complete(0)
    runner.apply()
    assert len(runner.requests[0].delivered) == 2
    assert tt.device.hazards.total == 0

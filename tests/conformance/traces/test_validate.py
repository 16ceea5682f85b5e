"""Trace validation of recorded runner events: a real run validates, an edited one diverges."""

from __future__ import annotations

from collections.abc import Callable

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.events import Event
from ttmirror.impl.rows import Row
from ttmirror.impl.runner import CLOSED, Status
from ttmirror.model.state import RING
from ttmirror.serving.engine import Engine, EngineConfig


def _run(requests: int, max_tokens: int, guard: bool = True) -> list[Event]:
    """An engine run at depth 2: staggered arrivals, stop tokens, request 0 preempted with a step
    in flight and resumed, request 2 aborted after its first token."""
    engine = Engine(CpuBackend(), EngineConfig(max_tokens=max_tokens, guard=guard))
    r = engine.runner
    submitted, preempted, aborted = 0, False, False
    for it in range(10_000):
        if submitted < requests and it % 2 == 0:
            engine.submit(submitted, (3 * submitted + 1) % 64,
                          stop_ids={(7 * submitted) % 64} if submitted % 3 == 0 else ())
            submitted += 1
        if not preempted and r.status(0) == Status.RUNNING and r.has_step_in_flight(0):
            engine.preempt(0)
            preempted = True
        if r.status(0) == Status.PREEMPTED and not r.live_rows(0):
            engine.resume(0)
        if not aborted and 2 in r.requests and r.requests[2].delivered:
            if r.status(2) not in CLOSED:
                engine.abort(2)
            aborted = True
        engine.step()
        if submitted == requests and engine.idle() and r.status(0) != Status.PREEMPTED:
            break
    engine.close()
    assert preempted
    return list(r.events.events)


def _most_in_flight(events: list[Event]) -> int:
    """The most steps in flight at once: schedules not yet applied."""
    most = now = 0
    for e in events:
        now += {"schedule": 1, "apply": -1}.get(e.action, 0)
        most = max(most, now)
    return most


def test_a_run_validates_against_the_model_and_really_overlapped() -> None:
    events = _run(2, 2)
    assert validate(events, RING) is None
    actions = [e.action for e in events]
    # Non-vacuous: two steps really were in flight at once, and slots were released.
    assert _most_in_flight(events) == 2
    assert "release" in actions and "preempt" in actions and "resume" in actions


def test_a_long_run_validates_far_beyond_the_default_bounds() -> None:
    events = _run(8, 8)
    assert sum(e.action == "schedule" for e in events) > 20 and _most_in_flight(events) == 2
    assert validate(events, RING._replace(requests=8, max_tokens=8)) is None


def test_two_applies_swapped_diverge_at_the_first_of_them() -> None:
    events = _run(2, 2)
    first = next(i for i, e in enumerate(events) if e.action == "apply")
    # The apply moved before the readback it needs: the model does not enable it there.
    done = max(i for i in range(first) if events[i].action == "readback_complete")
    edited = [*events[:done], events[first], *events[done:first], *events[first + 1:]]
    d = validate(edited, RING)
    assert d is not None and d.index == done and d.event.action == "apply"
    assert d.reason == "not enabled in this state" and any("readback_complete" in a
                                                           for a in d.allowed)


def test_a_release_before_its_readback_completes_diverges() -> None:
    events = _run(2, 2)
    i = next(i for i, e in enumerate(events) if e.action == "release")
    slot = events[i].args[0]
    issue = next(j for j, e in enumerate(events) if e.action == "readback_issue")
    edited = [*events[: issue + 1], events[i], *events[issue + 1 : i], *events[i + 1 :]]
    d = validate(edited, RING)
    assert d is not None and d.index == issue + 1 and d.event.args == (slot,)


def _with_rows(e: Event, change: Callable[[Row], Row]) -> Event:
    """`e` with each of its rows changed by `change`."""
    return Event(e.action, e.args, tuple(
        (k, tuple(change(r) for r in v) if k == "rows" else v) for k, v in e.detail))


def test_a_decision_the_model_would_not_make_diverges() -> None:
    events = _run(2, 2)
    i = next(i for i, e in enumerate(events)
             if e.action == "schedule" and any(r.prev_row is not None for r in e.get("rows")))
    wrong = _with_rows(events[i], lambda r: r._replace(prev_row=None))
    d = validate([*events[:i], wrong, *events[i + 1:]], RING)
    assert d is not None and d.index == i and "prev_rows" in d.reason


def test_a_position_the_model_would_not_give_diverges() -> None:
    events = _run(2, 2)
    i = next(i for i, e in enumerate(events) if e.action == "schedule" and any(
        r.pos > 0 for r in e.get("rows")))
    wrong = _with_rows(events[i], lambda r: r._replace(pos=r.pos + 1))
    d = validate([*events[:i], wrong, *events[i + 1:]], RING)
    assert d is not None and d.index == i and "positions" in d.reason


def test_an_enabled_but_unsafe_transition_diverges_on_the_invariant() -> None:
    """Guard off (recorded at allocate, so the model's guard is off too): every schedule is the
    model's, but a combine consumes a host placeholder, which StaleHostIdsGuard forbids."""
    events = _run(2, 2, guard=False)
    d = validate(events, bounds_of(events))
    assert d is not None and d.event.action == "combine"
    assert "StaleHostIdsGuard" in d.reason


def test_a_host_id_staged_from_the_wrong_position_diverges_at_its_combine() -> None:
    events = _run(2, 2)
    i = next(i for i, e in enumerate(events)
             if e.action == "combine" and any(r.host_pos for r in e.get("rows")))
    wrong = _with_rows(events[i], lambda r: r if r.host_pos is None else r._replace(
        host_pos=max(r.host_pos - 1, 0)))
    d = validate([*events[:i], wrong, *events[i + 1:]], RING)
    assert d is not None and d.index == i and "host ids of positions" in d.reason


def test_every_invariant_is_checked_after_some_action() -> None:
    """`CHECKED_AFTER` names invariants by name: a renamed or new one must not go unchecked."""
    from ttmirror.conformance.traces.validate import CHECKED_AFTER
    from ttmirror.model.invariants import INVARIANTS

    named = {name for names in CHECKED_AFTER.values() for name in names}
    assert named == {inv.name for inv in INVARIANTS}


def _edited(events: list[Event], action: str, name: str, value: object) -> tuple[int, list[Event]]:
    """`events` with the first `action`'s detail `name` set to `value`, and that event's index."""
    i = next(i for i, e in enumerate(events) if e.action == action)
    e = events[i]
    detail = tuple((k, value if k == name else v) for k, v in e.detail)
    return i, [*events[:i], e._replace(detail=detail), *events[i + 1:]]


def test_an_event_recorded_before_it_happened_diverges() -> None:
    # The runner's state, as each event recorded it, must show the action done: a launch recorded
    # while its step was still combined (before the device call) is not a launch.
    events = _run(2, 2)
    assert all(e.get("phase") for e in events if e.action in ("launch", "readback_complete"))
    i, edited = _edited(events, "launch", "phase", "combined")
    d = validate(edited, RING)
    assert d is not None and d.index == i and "recorded before it happened" in d.reason


def test_an_apply_whose_requests_hold_other_counts_diverges() -> None:
    events = _run(2, 2)
    i = next(i for i, e in enumerate(events) if e.action == "apply" and e.get("delivered"))
    (req, count), *rest = events[i].get("counts")
    assert count >= 1  # non-vacuous: the apply delivered, and said how many its request holds
    _, edited = _edited(events[i:], "apply", "counts", ((req, count + 1), *rest))
    d = validate([*events[:i], *edited], RING)
    assert d is not None and d.index == i and f"request {req} holds {count + 1} tokens" in d.reason

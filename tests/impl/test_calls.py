"""One steady decode step of the tt mirror: its ops are all documented, and the spec's figures
for what the step costs are the ones measured here."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ttmirror.emulator.calls import step_calls
from ttmirror.report import specdoc


@pytest.fixture(scope="module")
def eager() -> dict[str, Any]:
    return step_calls()


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    return step_calls(trace=True)


def test_every_op_of_a_step_is_documented_and_nothing_is_hazardous(
    eager: dict[str, Any], traced: dict[str, Any]
) -> None:
    assert len(eager["ops"]) == 10 and all(o["documented"] for o in eager["ops"])
    assert traced["ops"] == []  # replayed: the host issues no op at all
    assert eager["hazards"] == traced["hazards"] == 0
    assert traced["device_commands"] == eager["device_commands"]
    assert traced["host_calls"]["execute_trace"] == 1


def test_the_spec_states_the_measured_cost(eager: dict[str, Any], traced: dict[str, Any]) -> None:
    text = " ".join(specdoc.SPEC.read_text().split())
    found = re.search(
        r"runs (\d+) device commands: (\d+) host copies, (\d+) ops, (\d+) events, (\d+) waits "
        r"and the readback\..* the host makes (\d+) calls per step instead of (\d+)\.",
        text,
    )
    assert found is not None
    commands = eager["device_commands"]
    ops = sum(n for name, n in commands.items() if name in {"add", "gather", "where", "argmax"})
    assert [int(g) for g in found.groups()] == [
        eager["device_commands_per_step"],
        commands["copy_host_to_device_tensor"],
        ops,
        commands["record_event"],
        commands["wait_for_event"],
        traced["host_calls_per_step"],
        eager["host_calls_per_step"],
    ]
    assert commands["cpu"] == 1


@pytest.mark.parametrize("k", [1, 2])
def test_a_steady_step_with_drafts_is_documented_and_one_event_covers_its_copies(k: int) -> None:
    eager, traced = step_calls(spec_tokens=k), step_calls(trace=True, spec_tokens=k)
    assert eager["ops"] and all(o["documented"] for o in eager["ops"])
    assert {o["op"] for o in eager["ops"]} == {f"ttnn.{op}" for op in
                                                ("add", "gather", "where", "eq", "argmax")}
    assert traced["ops"] == [] and eager["hazards"] == traced["hazards"] == 0
    assert traced["device_commands"] == eager["device_commands"]
    commands = eager["device_commands"]
    # The ids, the K + 1 target tokens, the counts and the K drafts: copies before one event.
    assert commands["cpu"] == 2 * k + 3 and commands["record_event"] == 2
    assert commands["copy_host_to_device_tensor"] == 5 + k  # the K = 0 four, spec, host drafts
    assert commands["argmax"] == 2 * k + 1  # the target on K + 1 lanes, the drafter K times

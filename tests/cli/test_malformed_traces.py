"""`ttmirror validate` and `ttmirror replay` on malformed traces: exit 2, one line, no traceback.

Hypothesis edits a real trace of each kind (a serve-demo run for validate, a regression trace for
replay): truncated, a value of the wrong type, a huge integer, an unknown action, or the other
command's trace (another model's bounds). Any other edit may diverge (exit 1) but never crashes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ttmirror.cli import main
from ttmirror.resources import REGRESSIONS

REGRESSION = REGRESSIONS / "release-at-issue.itf.json"
KINDS = ("truncate", "type", "huge", "action", "other")
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
HUGE = 2**70


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("trace") / "run.json"
    assert main(["serve-demo", "--model", "probe", "--backend", "cpu", "--requests", "3",
                 "--trace", str(path)]) == 0
    return json.loads(path.read_text())


def _run(command: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple:
    path = tmp_path / "edited.json"
    path.write_text(text)
    capsys.readouterr()
    code = main([command, str(path)])
    return code, capsys.readouterr().err


def _leaves(data: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every scalar in `data` under its states."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _leaves(v, (*path, k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _leaves(v, (*path, i))]
    return [path]


def _set(data: Any, path: tuple, value: Any) -> Any:
    out = json.loads(json.dumps(data))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@st.composite
def malformed(draw: st.DrawFn, kind: str, data: dict[str, Any], other: dict[str, Any]) -> str:
    """`data` made malformed in the way `kind` says (one of `KINDS`)."""
    text = json.dumps(data)
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text) - 2))]
    if kind == "other":
        return json.dumps(other)
    states = data["states"]
    i = draw(st.integers(1 if states[0]["mbt::actionTaken"] == "init" else 0, len(states) - 1))
    if kind == "action":
        return json.dumps(_set(data, ("states", i, "mbt::actionTaken"),
                               draw(st.sampled_from(("teleport", "", "Schedule")))))
    ints = [p for p in _leaves(states[i]) if isinstance(_get(states[i], p), int)
            and not isinstance(_get(states[i], p), bool) and p[0] != "#meta"]
    assert ints, f"state {i} holds no integer to edit"
    where = draw(st.sampled_from(ints))
    value = HUGE if kind == "huge" else draw(st.sampled_from(("x", [1], {"a": 1}, 1.5)))
    return json.dumps(_set(data, ("states", i, *where), value))


def _get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


def _one_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("ttmirror: error: ") and "Traceback" not in err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["validate", "replay"])
@SETTINGS
@given(data=st.data())
def test_a_malformed_trace_is_refused_in_one_line(
        command: str, kind: str, data: st.DataObject, recorded: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    ours, other = recorded, json.loads(REGRESSION.read_text())  # validate's, and replay's
    if command == "replay":
        ours, other = other, ours
    text = data.draw(malformed(kind, ours, other))
    code, err = _run(command, text, tmp_path, capsys)
    assert code == 2 and _one_line(err), (code, err)

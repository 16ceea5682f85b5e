"""`ttmirror validate` on a run recorded by `serve-demo --trace`: valid, edited, truncated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ttmirror.cli import main


@pytest.fixture(scope="module")
def recorded_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "run.json"
    assert main(["serve-demo", "--model", "probe", "--backend", "cpu", "--trace", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def recorded(recorded_file: Path) -> dict:
    return json.loads(recorded_file.read_text())  # one JSON document, one state per line


def _validate(tmp_path: Path, data: dict | str, capsys: pytest.CaptureFixture[str]) -> tuple:
    path = tmp_path / "edited.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _actions(data: dict) -> list[str]:
    return [s["mbt::actionTaken"] for s in data["states"]]


def test_a_recorded_serving_run_validates(recorded: dict, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _validate(tmp_path, recorded, capsys)
    assert code == 0 and out.startswith("valid: ") and " 8 requests," in out
    actions = _actions(recorded)
    # Non-vacuous: the run preempted, resumed, finished, aborted and released slots.
    assert {"preempt", "resume", "finish", "abort", "release"} <= set(actions)


def test_two_applies_swapped_diverge_there(recorded: dict, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    states = recorded["states"]
    applies = [i for i, s in enumerate(states) if s["mbt::actionTaken"] == "apply"]
    picks = [json.dumps(states[i]["mbt::nondetPicks"]["delivered"]) for i in applies]
    a, b = next((applies[k], applies[k + 1]) for k in range(len(applies) - 1)
                if picks[k] != picks[k + 1])
    edited = dict(recorded, states=list(states))
    edited["states"][a], edited["states"][b] = states[b], states[a]
    code, out, _ = _validate(tmp_path, edited, capsys)
    assert code == 1 and f"diverges at event {a + 1} " in out and "<- here" in out


def test_a_release_before_its_readback_completes_diverges_there(
    recorded: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    states = recorded["states"]
    in_flight: list[int] = []  # the slots of the steps in flight, oldest first
    completed_at: dict[int, int] = {}  # slot -> index of its writer's last readback_complete
    target = None
    for i, s in enumerate(states):
        action, picks = s["mbt::actionTaken"], s["mbt::nondetPicks"]
        if action == "schedule":
            in_flight.append(picks["slot"])
        elif action == "apply":
            in_flight.pop(0)
        elif action == "readback_complete":
            completed_at[in_flight[picks["args"]["#tup"][0]]] = i
        elif action == "release":
            target = (i, completed_at[picks["args"]["#tup"][0]])
            break
    assert target is not None
    release, complete = target
    moved = [*states[:complete], states[release], *states[complete:release],
             *states[release + 1:]]
    code, out, _ = _validate(tmp_path, dict(recorded, states=moved), capsys)
    assert code == 1 and f"diverges at event {complete + 1} " in out
    assert "not enabled" in out and "the model allowed instead" in out


def test_a_truncated_trace_is_one_line_and_exit_2(recorded: dict, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(recorded)
    code, _, err = _validate(tmp_path, text[: len(text) // 2], capsys)
    assert code == 2 and "not JSON (truncated?)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, _, err = _validate(tmp_path, {"states": []}, capsys)
    assert code == 2 and "not a recorded run" in err


def test_the_written_trace_streams_and_a_cut_one_fails_at_its_end(
        recorded_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = recorded_file.read_text().splitlines(keepends=True)
    assert len(lines) == len(json.loads("".join(lines))["states"]) + 2  # header, states, close
    code, _, err = _validate(tmp_path, "".join(lines[: len(lines) // 2]), capsys)
    assert code == 2 and "unclosed (truncated?)" in err and len(err.strip().splitlines()) == 1
    code, _, err = _validate(tmp_path, "".join(lines[:-1]) + lines[-2][: 10], capsys)
    assert code == 2 and "truncated?" in err
    # An edit in the streamed layout diverges there (two applies swapped, lines kept).
    applies = [i for i, line in enumerate(lines) if '"mbt::actionTaken": "apply"' in line]
    a, b = next((applies[k], applies[k + 1]) for k in range(len(applies) - 1)
                if lines[applies[k]].split('"delivered"')[1] != lines[applies[k + 1]].split(
                    '"delivered"')[1])
    edited = list(lines)
    edited[a], edited[b] = lines[b], lines[a]
    code, out, _ = _validate(tmp_path, "".join(edited), capsys)
    assert code == 1 and f"diverges at event {a} " in out  # line a holds event a (1-based)


def test_progress_shows_on_a_terminal(recorded_file: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ttmirror.conformance.traces import validate

    monkeypatch.setattr(validate, "PROGRESS_EVERY", 100)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert main(["validate", str(recorded_file)]) == 0
    err = capsys.readouterr().err
    assert "validating: 100 events" in err and "\r" in err


# --- a run with drafts (spec rule 13) ------------------------------------------------------------


@pytest.fixture(scope="module")
def drafted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("trace") / "drafts.json"
    assert main(["serve-demo", "--model", "probe", "--backend", "cpu", "--spec-tokens", "2",
                 "--trace", str(path)]) == 0
    return json.loads(path.read_text())


def _picks(data: dict, action: str) -> list[tuple[int, dict]]:
    return [(i, s["mbt::nondetPicks"]) for i, s in enumerate(data["states"])
            if s["mbt::actionTaken"] == action]


def _edited(data: dict, index: int, edit: Any) -> dict:
    out = json.loads(json.dumps(data))
    edit(out["states"][index]["mbt::nondetPicks"])
    return out


def test_a_recorded_run_with_drafts_validates(drafted: dict, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _validate(tmp_path, drafted, capsys)
    assert code == 0 and "2 draft(s) per row" in out
    # Non-vacuous: rows carried drafts, and readbacks brought back every count 1..3.
    assert any(r["spec"] == 2 for _, p in _picks(drafted, "schedule") for r in p["rows"]["#tup"])
    counts = {c for _, p in _picks(drafted, "readback_complete") for c in p["counts"]["#tup"]}
    assert {1, 2, 3} <= counts


def _first_count(data: dict, at_least: int) -> tuple[int, int]:
    """The first readback with a count of at least `at_least`: its index and the row's."""
    return next((i, j) for i, p in _picks(data, "readback_complete")
                for j, c in enumerate(p["counts"]["#tup"]) if c >= at_least)


def test_a_verdict_edited_diverges(drafted: dict, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The launch takes its verdict from its readback: one accepted draft less on every row that
    # accepted some, and an apply delivers more tokens than the model's; one more than
    # scheduled, and the launch is not a model transition at all.
    edited = json.loads(json.dumps(drafted))
    for state in edited["states"]:
        if state["mbt::actionTaken"] == "readback_complete":
            counts = state["mbt::nondetPicks"]["counts"]["#tup"]
            counts[:] = [c - 1 if c >= 2 else c for c in counts]
    code, out, _ = _validate(tmp_path, edited, capsys)
    assert code == 1 and "tokens after the apply in the runner" in out
    i, j = _first_count(drafted, 1)

    def beyond(p: dict) -> None:
        p["counts"]["#tup"][j] = 4  # 3 accepted of 2 drafts

    code, out, _ = _validate(tmp_path, _edited(drafted, i, beyond), capsys)
    assert code == 1 and "not enabled" in out
    assert any("launch(" in line and "<- here" in line for line in out.splitlines())


def test_drafts_scheduled_otherwise_diverge(drafted: dict, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    i = next(i for i, p in _picks(drafted, "schedule") if any(r["spec"] for r in p["rows"]["#tup"]))

    def fewer(p: dict) -> None:
        next(r for r in p["rows"]["#tup"] if r["spec"])["spec"] = 1

    code, out, _ = _validate(tmp_path, _edited(drafted, i, fewer), capsys)
    assert code == 1 and f"diverges at event {i + 1} " in out and "drafts scheduled" in out
    # Read as a run without drafts, its first row with drafts leaves the model.
    code, out, _ = _validate(tmp_path, _edited(drafted, 0, lambda p: p.pop("spec_tokens")),
                             capsys)
    assert code == 1 and "the runner's positions" in out

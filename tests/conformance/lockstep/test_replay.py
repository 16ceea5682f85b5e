"""`ttmirror replay`: 0 conforms, 1 reproduces a failure, 2 malformed or not for this model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ttmirror.cli import main
from ttmirror.resources import REGRESSIONS

TRACE = REGRESSIONS / "deliver-dropped.itf.json"


def test_regression_conforms_without_its_bug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(TRACE)]) == 0
    assert "conforms" in capsys.readouterr().out


def test_regression_reproduces_with_its_bug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(TRACE), "--bug", "deliver-dropped"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES" in out and "first divergence at step" in out


def test_cpu_backend_replays_a_host_side_bug() -> None:
    assert main(["replay", str(TRACE), "--backend", "cpu", "--bug", "deliver-dropped"]) == 1


@pytest.mark.parametrize("content", ["not json", '{"a": 1}', "[]", '{"#meta": {}}'])
def test_malformed_exits_2(content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                           ) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ttmirror: error:") and err.count("\n") == 1 and "Traceback" not in err


def test_other_model_or_tampered_state_exits_2(tmp_path: Path) -> None:
    data = json.loads(TRACE.read_text())
    data["#meta"]["ttmirror"]["model"] = "two-phase-commit"
    (tmp_path / "other.json").write_text(json.dumps(data))
    assert main(["replay", str(tmp_path / "other.json")]) == 2
    data = json.loads(TRACE.read_text())
    data["states"][3]["next_slot"] = 7
    (tmp_path / "tampered.json").write_text(json.dumps(data))
    assert main(["replay", str(tmp_path / "tampered.json")]) == 2
    data = json.loads(TRACE.read_text())
    data["states"][2]["mbt::actionTaken"] = "apply"
    (tmp_path / "disabled.json").write_text(json.dumps(data))
    assert main(["replay", str(tmp_path / "disabled.json")]) == 2


def test_missing_file_exits_2() -> None:
    assert main(["replay", "/nonexistent/trace.json"]) == 2

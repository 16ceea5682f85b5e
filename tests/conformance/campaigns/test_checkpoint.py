"""`ttmirror fuzz --checkpoint FILE`: a campaign spans runs. A resumed run counts the saved
edges as covered, walks the rest (and not the whole graph again), and adds up the totals; a
file of another campaign, or not a checkpoint at all, is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ttmirror.cli import main
from ttmirror.conformance.campaigns.shards import decode_ids, encode_ids


def fuzz(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str,
         code: int = 0) -> tuple[dict[str, Any] | None, str]:
    got = main(["fuzz", "--backend", "cpu", "--requests", "1", "--examples", "5", "--jobs", "1",
                "--traces", str(tmp_path / "traces"), "--database", str(tmp_path / "db"),
                "--checkpoint", str(tmp_path / "cp.json"), "--json", *extra])
    out, err = capsys.readouterr()
    assert got == code, err[-2000:]
    return (json.loads(out) if out.strip() else None), err


def keep_half(path: Path) -> int:
    """Drop every other saved edge from the checkpoint at `path`; the edges kept."""
    data = json.loads(path.read_text())
    kept = decode_ids(data["covered_edges"])[::2]
    data["covered_edges"] = encode_ids(kept)
    path.write_text(json.dumps(data))
    return len(kept)


@pytest.mark.parametrize("spec", [[], ["--spec-tokens", "1"]], ids=["plain", "drafts"])
def test_a_resumed_campaign_walks_only_what_is_left(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: list[str]) -> None:
    first, _ = fuzz(tmp_path, capsys, *spec)
    assert first is not None and first["edges_covered"] == 1.0 and first["runs"] == 1
    saved = json.loads((tmp_path / "cp.json").read_text())
    assert len(decode_ids(saved["covered_edges"])) == first["total_edges"]
    assert saved["progress"]["walks"] == first["walks"]
    kept = keep_half(tmp_path / "cp.json")
    second, err = fuzz(tmp_path, capsys, *spec)
    assert second is not None and "resuming" in err
    assert second["runs"] == 2 and second["resumed_at_edges"] == kept
    assert second["edges_covered"] == 1.0 and second["stopped"] == "covered"
    walked_now = second["walks"] - first["walks"]
    # Every edge the checkpoint lost was walked again, and far from the whole graph.
    assert first["total_edges"] - kept <= walked_now < first["total_edges"]
    assert second["hypothesis_examples"] == first["hypothesis_examples"]  # not run again
    assert second["steps"] > first["steps"]  # totals add up across runs


def test_another_campaigns_checkpoint_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fuzz(tmp_path, capsys)
    report, err = fuzz(tmp_path, capsys, "--seed", "7", code=1)
    assert report is None
    assert err.strip().splitlines()[-1].endswith(
        "is another campaign's (different: seed); give this campaign its own file")


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 1}', '{"version": 99}'])
def test_a_malformed_checkpoint_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    (tmp_path / "cp.json").write_text(text)
    report, err = fuzz(tmp_path, capsys, code=1)
    assert report is None and "Traceback" not in err
    assert "not a fuzz checkpoint" in err.strip().splitlines()[-1]
    assert (tmp_path / "cp.json").read_text() == text  # nothing of the user's is overwritten


def test_a_shard_takes_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    _, err = fuzz(tmp_path, capsys, "--shard", "1/2", code=2)
    assert "--checkpoint resumes branch walks" in err.strip().splitlines()[-1]

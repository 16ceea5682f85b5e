"""`ttmirror fuzz --shard I/N`: the walk plan is one pure function of the seed and the bounds,
so N shards take every walk once, and `ttmirror coverage merge` of their reports covers what
one unsharded run covers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttmirror.cli import main
from ttmirror.conformance.campaigns.shards import decode_ids, encode_ids, parse_shard


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.sets(st.integers(0, 2**31)))
def test_edge_ids_travel_as_text_and_back(ids: set[int]) -> None:
    assert decode_ids(encode_ids(ids)) == sorted(ids)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_shard_is_i_of_n(text: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


def fuzz(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(["fuzz", "--requests", "1", "--examples", "20", "--seed", "3", "--jobs", "1",
                 "--traces", str(tmp_path / "traces"), "--database", str(tmp_path / "db"),
                 "--json", *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def test_two_shards_merged_cover_what_one_unsharded_run_covers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = fuzz(tmp_path, capsys)
    parts = [fuzz(tmp_path, capsys, "--shard", f"{i}/2") for i in (1, 2)]
    for i, part in enumerate(parts, start=1):
        assert part["shard"] == f"{i}/2" and part["walk_mode"] == "from-initial"
        assert part["stopped"] == "covered" and part["edges_covered"] < 1.0  # a share only
        assert part["seed"] == 3 and part["hypothesis_seed"] == 3 + i - 1
    # No walk taken twice: the shards' walks are disjoint and together the whole plan.
    taken = [set(decode_ids(p["walks_taken"])) for p in parts]
    assert taken[0] and taken[1] and not taken[0] & taken[1]
    assert taken[0] | taken[1] == set(range(len(taken[0]) + len(taken[1])))
    assert all(w % 2 == 0 for w in taken[0]) and all(w % 2 == 1 for w in taken[1])
    files = []
    for i, part in enumerate(parts, start=1):
        files.append(tmp_path / f"shard{i}.json")
        files[-1].write_text(json.dumps(part))
    assert main(["coverage", "merge", *map(str, files), "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["edges_covered"] == whole["edges_covered"] == 1.0
    assert merged["walks_still_needed"] == 0 and merged["walks_taken_twice"] == 0
    assert merged["total_edges"] == whole["total_edges"]
    # One shard alone leaves walks to take, and the merge says how many.
    assert main(["coverage", "merge", str(files[0]), "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["edges_covered"] < 1.0 and alone["walks_still_needed"] > 0


def test_merging_reports_of_different_campaigns_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = {"bounds": {"requests": 1}, "seed": 3, "covered_edges": encode_ids([0, 1])}
    b = {"bounds": {"requests": 2}, "seed": 3, "covered_edges": encode_ids([2])}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    (tmp_path / "bad.json").write_text("{ not json")
    assert main(["coverage", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "bounds or seed differ" in capsys.readouterr().err
    assert main(["coverage", "merge", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a `ttmirror fuzz --json` report" in err and "\n" not in err
    assert main(["fuzz", "--shard", "3/2"]) == 2
    assert "--shard 3/2" in capsys.readouterr().err

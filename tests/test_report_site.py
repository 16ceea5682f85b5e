"""`ttmirror report` without a browser: bad input is one line and exit 2, before any work; an
unreadable regression trace is shown as such, not a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttmirror.cli import main
from ttmirror.model.state import Bounds
from ttmirror.review import known_bad, trace_table


@pytest.mark.parametrize("args", [
    ["--fuzz-seconds", "-1"],
    ["--jobs", "0"],
    ["--traces", "/nonexistent/folder"],
    ["--requests", "0"],
])
def test_bad_arguments_are_one_line_and_exit_2(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "-o", str(tmp_path / "site"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ttmirror: error: "), err
    assert not (tmp_path / "site").exists()


def test_a_malformed_kill_matrix_is_refused_before_exploring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kills.json"
    bad.write_text('{"not": "a list"}')
    assert main(["report", "-o", str(tmp_path / "site"), "--mutants", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a `ttmirror mutants --json` file" in err and "\n" not in err
    assert not (tmp_path / "site").exists()


def test_an_unreadable_trace_is_shown_as_unreadable(tmp_path: Path) -> None:
    broken = tmp_path / "broken.itf.json"
    broken.write_text("{ not json")
    row = trace_table(broken)
    assert row["name"] == "broken.itf.json" and row["error"].startswith("unreadable: ")


def test_every_known_bad_variant_of_the_manifest_fails_at_the_default_bounds() -> None:
    from ttmirror.model.explore import explore

    variants = known_bad(Bounds())
    assert len(variants) >= 5
    for name, _about, bounds in variants[:3]:  # the rest: the manifest's own test checks them
        assert explore(bounds).failure() is not None, name


def test_at_the_default_bounds_the_page_shows_what_check_json_prints(tmp_path: Path) -> None:
    import json
    import re

    from ttmirror import report
    from ttmirror.model.explore import explore

    assert main(["report", "--fuzz-seconds", "0", "--no-tlc", "-o", str(tmp_path)]) == 0
    page = (tmp_path / "index.html").read_text()
    expected = report.as_json(explore(Bounds()))
    figures = dict(re.findall(r'data-figure="(\w+)">([\d,]+)<', page))
    for key in ("states", "transitions", "deadlocks", "cannot_finish", "final_states"):
        assert figures[key] == f"{expected[key]:,}", key
    verdicts = dict(re.findall(r'data-verdict="(\w+)">(\w+)<', page))
    assert verdicts == expected["invariants"]
    # Nothing the page loads or links to is off the folder.
    targets = re.findall(r'(?:href|src)="([^"]+)"', page)
    assert targets and not [t for t in targets if "://" in t or t.startswith("//")]
    assert all((tmp_path / t.split("#")[0]).is_file() for t in targets if not t.startswith("#"))
    # The page's data parses (the script reads it) and holds both views' states.
    data = json.loads(re.search(r'<script type="application/json" id="review-data">(.*?)'
                                r"</script>", page, re.S).group(1))  # type: ignore[union-attr]
    assert set(data["views"]) == {"slot", "request"} and data["counterexamples"]


def test_values_on_the_page_are_escaped(tmp_path: Path) -> None:
    """The page comes from templates with escaping on: a planted bug's id full of markup (from a
    kill matrix file) shows as text, never as markup."""
    import json

    from ttmirror.review import TEMPLATES

    evil = "<script>alert('kill')</script>"
    kills = tmp_path / "kills.json"
    kills.write_text(json.dumps([{"id": evil, "killed": True, "config": "eager-2cq"}]))
    assert main(["report", "--requests", "1", "--fuzz-seconds", "0", "--no-tlc", "--mutants",
                 str(kills), "-o", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert evil not in page and "&lt;script&gt;alert(&#39;kill&#39;)&lt;/script&gt;" in page
    # The twin: the same section without escaping carries the markup, so the check can fail.
    table = {"rows": [{"id": evil, "killed": True}], "note": "1 of 1"}
    raw = TEMPLATES.overlay(autoescape=False).get_template("sections.html").module
    assert evil in str(raw.kill_matrix(table))  # type: ignore[attr-defined]
    escaped = TEMPLATES.get_template("sections.html").module
    assert evil not in str(escaped.kill_matrix(table))  # type: ignore[attr-defined]

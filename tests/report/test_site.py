"""`ttmirror report` without a browser: bad input is one line and exit 2, before any work; an
unreadable regression trace is shown as such, not a crash; a failing check (a violated
invariant, a "sometimes" check not reached) is written, exits 1 and the page says what failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ttmirror.cli import main
from ttmirror.model.state import RING
from ttmirror.report.site import known_bad, trace_table


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


def test_every_known_bad_variant_of_the_manifest_fails_on_the_ring() -> None:
    from ttmirror.model.explore import explore

    variants = known_bad(RING)
    assert len(variants) >= 5
    for name, _about, bounds in variants[:3]:  # the rest: the manifest's own test checks them
        assert explore(bounds).failure() is not None, name


def test_on_the_ring_the_page_shows_what_check_json_prints(tmp_path: Path) -> None:
    """At the ring's default sizes (the default bounds' graph is four times its size)."""
    import json
    import re

    from ttmirror.model.explore import explore
    from ttmirror.report import check as report

    assert main(["report", "--fuzz-seconds", "0", "--no-tlc", "--state", "ring", "--no-subsets",
                 "-o", str(tmp_path)]) == 0
    page = (tmp_path / "index.html").read_text()
    expected = report.as_json(explore(RING))
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
    # The proof for every size beside the bounded check: each obligation as `prove` gives it.
    from ttmirror.cli.prove import run_set
    from ttmirror.proof.obligations import RLIMIT
    from ttmirror.proof.relation import Options

    proved = run_set(Options(), "z3", RLIMIT, lambda line: None)
    cells = dict(re.findall(r'data-obligation="([\w:@]+)">(\w+)<', page))
    assert cells == {f"{o['kind']}:{o['name']}": "holds" for o in proved["obligations"]}
    verdict = re.search(r'id="proof-verdict">(.*?)</p>', page, re.S)
    assert verdict is not None and "holds for every number of requests, tokens, preemptions " \
        "and steps" in verdict.group(1)


def test_values_on_the_page_are_escaped(tmp_path: Path) -> None:
    """The page comes from templates with escaping on: a planted bug's id full of markup (from a
    kill matrix file) shows as text, never as markup."""
    import json

    from ttmirror.report.site import TEMPLATES

    evil = "<script>alert('kill')</script>"
    kills = tmp_path / "kills.json"
    kills.write_text(json.dumps([{"id": evil, "killed": True, "config": "eager-2cq"}]))
    assert main(["report", "--requests", "1", "--fuzz-seconds", "0", "--no-tlc", "--no-prove",
                 "--mutants",
                 str(kills), "-o", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert evil not in page and "&lt;script&gt;alert(&#39;kill&#39;)&lt;/script&gt;" in page
    # The twin: the same section without escaping carries the markup, so the check can fail.
    table = {"rows": [{"id": evil, "killed": True}], "note": "1 of 1"}
    raw = TEMPLATES.overlay(autoescape=False).get_template("sections.html").module
    assert evil in str(raw.kill_matrix(table))  # type: ignore[attr-defined]
    escaped = TEMPLATES.get_template("sections.html").module
    assert evil not in str(escaped.kill_matrix(table))  # type: ignore[attr-defined]


# --- a failing check: the page must say so, not show `ok` ---------------------------------------


def _failing_report(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    args: list[str]) -> tuple[dict[str, Any], str]:
    """Write the report at failing bounds: exit 1, the site written all the same, and stderr's
    last line saying what failed. Returns what the page shows and that line."""
    import html
    import json
    import re

    code = main(["report", *args, "--fuzz-seconds", "0", "--no-tlc", "--no-prove", "--jobs", "1",
                 "-o", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    page = (tmp_path / "index.html").read_text()
    header = re.search(r'id="passed">\s*(.*?)\s*</span>', page, re.S)
    printed = re.search(r'<pre id="check-json">(.*?)</pre>', page, re.S)
    assert header is not None and printed is not None
    shown = {
        "header": html.unescape(header.group(1)),
        "verdicts": dict(re.findall(r'data-verdict="(\w+)">(\w+)<', page)),
        "sometimes": dict(re.findall(r'data-sometimes="(\w+)">([\w ]+)<', page)),
        "json": json.loads(html.unescape(printed.group(1))),
    }
    return shown, err[-1]


def test_a_violated_invariant_is_shown_violated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """guard-off at one request: StaleHostIdsGuard fails with the manifest's shortest
    counterexample, and the verdict row, the header and the embedded JSON all say so."""
    from ttmirror import manifest
    from ttmirror.model.explore import explore
    from ttmirror.report import check as report

    bad = manifest.entry("small-guard-off")
    shown, last = _failing_report(tmp_path, capsys, ["--variant", "guard-off", "--requests", "1",
                                                     "--state", "ring", "--no-subsets"])
    expected = report.as_json(explore(bad.bounds))
    assert shown["verdicts"]["StaleHostIdsGuard"] == "violated"
    assert shown["verdicts"] == expected["invariants"]  # the rest are ok, as check says
    assert shown["header"].startswith("FAIL: violated: StaleHostIdsGuard")
    assert "PASS" not in shown["header"]
    check = shown["json"]
    assert check["passed"] is False and check["violated"] == "StaleHostIdsGuard"
    assert check["invariants"]["StaleHostIdsGuard"] == "violated"
    assert len(check["counterexample"]) == bad.length
    assert last.startswith("report: the check failed: violated: StaleHostIdsGuard")


def test_a_sometimes_check_not_reached_is_shown_not_reached(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One request of one token: every invariant holds, but no step ever combines from the
    mirror (there is no second token) nor overlaps another: vacuous, so the check fails."""
    unreached = {"combined_from_mirror", "steps_overlap"}
    shown, last = _failing_report(tmp_path, capsys, ["--requests", "1", "--max-tokens", "1"])
    assert set(shown["verdicts"].values()) == {"ok"}
    assert {n for n, v in shown["sometimes"].items() if v == "NOT reached"} == unreached
    assert {n for n, v in shown["sometimes"].items() if v == "reached"}  # the others are
    assert shown["header"] == "FAIL: not reached: combined_from_mirror, steps_overlap"
    check = shown["json"]
    assert check["passed"] is False and check["violated"] is None
    assert {n for n, hit in check["sometimes"].items() if not hit} == unreached
    assert last == "report: the check failed: not reached: combined_from_mirror, steps_overlap"

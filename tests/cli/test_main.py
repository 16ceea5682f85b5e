"""The command line: exit codes, one-line errors, the JSON contract, graphs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ttmirror.cli import main
from ttmirror.impl.cpu_backend import CpuBackend

SMALL = ["--requests", "1"]
RING_FLAGS = ["--state", "ring", "--no-subsets"]
"""The V1 ring's bounds (the defaults are state rows and vLLM's freedoms)."""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ttmirror.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--depth", "5"],
        ["check", "--slots", "0"],
        ["check", "--requests", "9"],
        ["check", "--max-tokens", "x"],
        ["check", "--preemptions", "-1"],
        ["check", "--release-at", "never"],
        ["check", "--preempt-policy", "sometimes"],
        ["check", "--prefill-chunks", "0"],
        ["check", "--variant", "no-such-variant"],
        ["check", "--prefill-chunks", "1", "--variant", "partial-prefill-feeds-mirror"],
        ["check", "--no-host-sync", "--variant", "host-sync-unguarded"],
        ["fuzz", "--variant", "resume-with-placeholder"],
        ["check", "--frobnicate"],
        ["check", "--jobs", "0"],
        ["graph", "--view", "sideways"],
        ["graph", "--format", "png"],
        ["graph", "--view", "slot", "--slot", "7", *SMALL],
        ["graph", "--view", "counterexample", *SMALL],
        [],
        ["nonsense"],
        # Subcommands of the plugin modules: their UsageError is the one main() catches, also
        # when cli.py runs as __main__.
        ["fuzz", "--jobs", "0"],
        ["serve-demo", "--requests", "0"],
        ["serve-demo", "--prefill-chunk", "0"],
        ["serve-demo", "--preempt-policy", "never"],
        ["mutants", "--bug", "no-such-bug"],
        ["check", "--no-faults", "--variant", "fault-spares-later-rows"],
        ["soak", "--steps", "0"],
        ["soak", "--fault-rate", "1.5"],
        ["soak", "--timeout", "-1"],
        ["soak", "--trace", "/proc/nowhere/x.json"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str]) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ttmirror: error: "), done.stderr
    assert "Traceback" not in done.stderr


def test_check_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("params", "states", "transitions", "seconds", "invariants", "sometimes",
                "deadlocks", "counterexample"):
        assert key in out
    assert out["params"]["requests"] == 1 and out["params"]["depth"] == 2
    assert set(out["invariants"].values()) == {"ok"}
    assert out["counterexample"] is None and out["deadlocks"] == 0
    assert out["sometimes"] and all(out["sometimes"].values())


def test_check_no_guard_exits_1_with_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL, "--no-guard", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["invariants"]["StaleHostIdsGuard"] == "violated"
    assert out["violated"] == "StaleHostIdsGuard"
    assert [s["action"] for s in out["counterexample"]][-1] == "combine(q=1)"
    assert all(set(s) == {"action", "changes"} for s in out["counterexample"])


def test_check_text_names_the_violation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL, "--slots", "1"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED  NoRewriteWhileReaderOutstanding" in out
    assert "shortest counterexample to NoRewriteWhileReaderOutstanding" in out


def test_graph_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("dot", "mermaid", "json", "svg"):
        target = tmp_path / f"g.{fmt}"
        assert main(["graph", *SMALL, "--view", "slot", "--format", fmt, "-o", str(target)]) == 0
        text = target.read_text()
        assert {"dot": "digraph", "mermaid": "stateDiagram-v2", "json": '"nodes"',
                "svg": "<svg"}[fmt] in text
    data = json.loads((tmp_path / "g.json").read_text())
    assert {n["label"] for n in data["nodes"]} >= {"free", "released"}


def test_graph_highlights_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", *SMALL, "--no-guard", "--view", "request", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["violation"] == "StaleHostIdsGuard"
    assert any(e["counterexample"] for e in data["edges"])
    assert main(["graph", *SMALL, "--no-guard", "--view", "counterexample",
                 "--format", "mermaid"]) == 0
    assert "⚠ combine(q=1)" in capsys.readouterr().out


def test_full_view_refuses_unreadable_graphs() -> None:
    done = run_cli("graph", "--view", "full")
    assert done.returncode == 2 and "use --view slot" in done.stderr


def test_full_view_at_tiny_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["graph", "--view", "full", "--requests", "1", "--max-tokens", "1", "--depth", "1",
            "--no-abort", "--no-preempt", "--no-finish", "--format", "dot", *RING_FLAGS]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "allocate [allocated]" in out and "arrive(r0) [requests[0]]" in out


@pytest.mark.parametrize("args", [
    ["graph", "--slot", "7"],
    ["graph", "--view", "request", "--request", "2"],
    ["graph", "-o", "/proc/x.svg", "--format", "svg"],
    ["graph", "-o", "/"],
])
def test_bad_graph_arguments_fail_before_any_exploration(
        args: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """At the default bounds (a minute to explore): the check comes first, so nothing explores."""
    import ttmirror.cli.core as cli

    def explored(*_: object) -> None:
        raise AssertionError("explored before checking the arguments")

    monkeypatch.setattr(cli, "_explore", explored)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ttmirror: error: " in err


def test_output_paths_of_long_runs_are_checked_before_they_start(
        capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["serve-demo", "--trace", "/proc/x.json"], ["mutants", "--traces", "/proc/x"],
                 ["fuzz", "--traces", "/proc/x"]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "cannot" in err, err


def test_unwritable_output_is_a_one_line_error(tmp_path: Path) -> None:
    done = run_cli("graph", *SMALL, "-o", str(tmp_path / "missing" / "g.mmd"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1


@pytest.mark.parametrize("backend", ["tt", "cpu"])
def test_info_reports_async_on_for_capable_backends(backend: str) -> None:
    done = run_cli("info", "--backend", backend, "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["backend"] == backend
    assert info["supports_async_sampled_token_readback"] is True
    assert info["async_scheduling_enabled"] is True and info["max_concurrent_batches"] == 2
    assert info["device"] == ("emulated" if backend == "tt" else "cpu")
    if backend == "tt":
        ops = info["ops"]
        # The mirror path's ops, each argument on a documented row: the combine (4 conversions,
        # gather, where) and the probe forward (2 adds, gather, argmax).
        assert [o["op"].removeprefix("ttnn.") for o in ops] == [
            "add", "add", "add", "add", "gather", "where", "add", "add", "gather", "argmax"
        ]
        assert all(o["documented"] is True for o in ops)
        assert all(a["row"] and a["rule"] for o in ops for a in o["args"].values())
        index = ops[4]["args"]["index"]
        assert index["layout"] == "TILE" and index["row"] == "UINT16, UINT32 in TILE"
        steps = info["commands_per_step"]
        assert steps["traced"]["host_calls"] < steps["eager"]["host_calls"]
        assert steps["traced"]["device_commands"] == steps["eager"]["device_commands"]
    else:
        assert "ops" not in info


def test_info_async_off_and_unknown_backend() -> None:
    done = run_cli("info", "--backend", "cpu", "--async-scheduling", "off", "--json")
    info = json.loads(done.stdout)
    assert info["async_scheduling_enabled"] is False and info["max_concurrent_batches"] == 1
    bad = run_cli("info", "--backend", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_info_with_drafts_resolves_off_without_a_draft_aware_combine(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("cpu", "tt"):  # both combines are draft-aware
        done = run_cli("info", "--backend", name, "--spec-tokens", "1", "--json")
        info = json.loads(done.stdout)
        assert info["spec_tokens"] == 1 and info["supports_draft_aware_combine"] is True
        assert info["async_scheduling_enabled"] is True and info["max_concurrent_batches"] == 2
    ops = [o["op"].removeprefix("ttnn.") for o in info["ops"]]  # tt's steady step with drafts
    assert "eq" in ops and ops.count("argmax") == 3 and all(o["documented"] for o in info["ops"])

    class IdsOnly(CpuBackend):
        """Mirrors sampled ids, but its combine is not draft-aware."""

        def supports_draft_aware_combine(self) -> bool:
            return False

    monkeypatch.setattr("ttmirror.cli.info.get_backend", lambda name: IdsOnly())
    assert main(["info", "--backend", "ids-only", "--spec-tokens", "1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec_tokens"] == 1 and info["supports_draft_aware_combine"] is False
    assert info["async_scheduling_enabled"] is False and info["max_concurrent_batches"] == 1
    assert main(["info", "--backend", "ids-only", "--spec-tokens", "1",
                 "--async-scheduling", "on"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no draft-aware combine" in err


@pytest.mark.parametrize(
    ("args", "invariant", "length"),
    [
        (["--variant", "resume-with-placeholder", *RING_FLAGS], "StaleHostIdsGuard", 9),
        (["--variant", "partial-prefill-feeds-mirror", *RING_FLAGS], "StaleHostIdsGuard", 7),
        (["--variant", "host-sync-unguarded", *RING_FLAGS], "StaleHostIdsGuard", 7),
        (["--variant", "guard-off", *RING_FLAGS], "StaleHostIdsGuard", 7),
    ],
)
def test_variants_fail_check_with_their_shortest_counterexample(
    args: list[str], invariant: str, length: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # A variant implies the option it needs (chunking, host sync), so it fails on its own.
    assert main(["check", *SMALL, *args, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["violated"] == invariant and len(out["counterexample"]) == length


@pytest.mark.parametrize("args", [["--preempt-policy", "drop"], ["--prefill-chunks", "2"],
                                  ["--host-sync"]])
def test_each_option_passes_check(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL, *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True

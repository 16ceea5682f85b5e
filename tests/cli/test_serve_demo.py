"""`ttmirror serve-demo`: outputs and timing on success; one line and exit 2 on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ttmirror.cli import main


def test_serve_demo_tt_prints_requests_and_timing() -> None:
    # A subprocess: the tt backend routes ttnn to the emulated device for the whole process.
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "serve-demo", "--model", "probe", "--backend", "tt"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "max_concurrent_batches=2" in out and "async scheduling auto -> on" in out
    assert out.count("  r") == 8 and "aborted" in out and "tok/s" in out
    lines = out.splitlines()
    assert "preemptions" in lines[-2] and lines[-1].startswith("validated: ")


def test_serve_demo_cpu_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve-demo", "--model", "probe", "--backend", "cpu", "--sampling", "seeded",
                 "--requests", "3", "--max-tokens", "4"])
    assert code == 0
    assert "seeded(seed=0" in capsys.readouterr().out


def test_serve_demo_logprobs_under_a_step_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve-demo", "--model", "probe", "--backend", "cpu", "--sampling", "seeded",
                 "--requests", "4", "--logprobs", "2", "--max-step-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("logprobs: mean") == 4 and "top 2:" in out


def test_serve_demo_with_drafts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve-demo", "--model", "probe", "--backend", "cpu", "--spec-tokens", "2",
                 "--logprobs", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 draft(s) per decoding row from probe-drafter" in out
    drafts = next(line for line in out.splitlines() if line.startswith("drafts: "))
    assert "accepted 0: " in drafts and ", 2: " in drafts and "drafts accepted (" in drafts
    assert out.count("logprobs: mean") == 8 and out.splitlines()[-1].startswith("validated: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "1,2,64"], "prompt id 64 at index 2 is outside the vocabulary [0, 64)"),
        (["--prompt", "1,-3"], "prompt id -3 at index 1 is outside the vocabulary"),
        (["--prompt", "a,b"], "--prompt must be comma-separated integers"),
        (["--requests", "0"], "--requests must be at least 1"),
        (["--model", "qwen3-4b"], "checkpoint qwen3-4b"),
        (["--async-scheduling", "maybe"], "invalid choice"),
        (["--max-step-tokens", "5"], "max_step_tokens (5) must be at least rows (8)"),
        (["--logprobs", "0"], "--logprobs must be at least 1"),
        (["--logprobs", "65"], "max_logprobs must be in [0, 64]"),
        (["--spec-tokens", "3"], "--spec-tokens must be 0, 1 or 2"),
        (["--spec-tokens", "-1"], "--spec-tokens must be 0, 1 or 2"),
        (["--spec-tokens", "2", "--max-step-tokens", "16"],
         "max_step_tokens (16) must be at least rows (8) times 1 + spec_tokens (3)"),
    ],
)
def test_serve_demo_bad_input(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if args[:2] == ["--model", "qwen3-4b"]:
        from ttmirror.serving.models import CheckpointUnavailable, checkpoint_path

        try:
            checkpoint_path("qwen3-4b")
            pytest.skip("qwen3-4b is cached here")
        except CheckpointUnavailable:
            pass
    base = ["serve-demo", "--backend", "cpu"] + ([] if "--model" in args else ["--model", "probe"])
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

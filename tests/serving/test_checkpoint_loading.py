"""The checkpoint loader on a checkpoint it can have here: a tiny Qwen3 written into a local
Hugging Face cache laid out as the hub lays it out (nothing is downloaded, ever)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ttmirror.serving.models import (
    CheckpointUnavailable,
    build_tiny,
    checkpoint_path,
    load_checkpoint,
)


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_cached_checkpoint_loads_with_its_weights(hub_cache: Path) -> None:
    tiny = build_tiny("tiny-qwen3", seed=3)
    repo = hub_cache / "models--Qwen--Qwen3-0.6B"
    tiny.model.save_pretrained(repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    loaded = load_checkpoint("qwen3-0.6b")
    context = torch.tensor([5, 1, 200, 7])
    assert loaded.vocab == tiny.vocab and loaded.max_context == 128
    assert torch.equal(loaded.logits(context, 3), tiny.logits(context, 3))


def test_absent_checkpoint_names_itself(hub_cache: Path) -> None:
    with pytest.raises(CheckpointUnavailable, match=r"llama-3.2-1b \(meta-llama/Llama-3.2-1B\)"):
        checkpoint_path("llama-3.2-1b")

"""Decoder models the serving loop runs: the probe, tiny transformers, cached checkpoints.

Every model answers one question, `logits(context, pos)`: the next-token logits (float32, [V])
after the token sequence `context` (prompt tokens, then generated ones; its last token is the
one consumed at runner position `pos`). The serving mirror calls it once per row per step over
the row's whole context (a recompute "KV cache"), so a row's numerics never depend on which
other rows share its step: async and sync serving can then be compared token for token.

- `probe`: next token = perm[(token + pos) mod V] (`probe.py`), as one-hot logits.
- `tiny-qwen3`, `tiny-mistral`, `tiny-llama`: the real `transformers` architectures, built from
  tiny configs with seeded random weights (no download), float32, eager attention.
- checkpoints (`qwen3-0.6b`, ...): loaded only from the local Hugging Face cache, offline;
  absent ones raise `CheckpointUnavailable` naming the checkpoint.

Speculative decoding (spec rule 13) drafts with `drafter_for(model, drafts)`, a model of the
same kind the device runs after verification: the probe's drafter is its second one-hot table
(`impl/drafts.py`, right on a seeded share of rows); a `transformers` model's is the model itself
with its later layers skipped (its first half, then the final norm and head: self-speculation),
which agrees with the whole model on some tokens and not others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..impl.drafts import DraftSpec, draft_table
from ..impl.probe import ProbeSpec, permutation
from .catalog import CHECKPOINTS, TINY_ARCHS, model_names


class DecoderModel(Protocol):
    name: str
    vocab: int
    max_context: int
    """Most tokens a context may hold (prompt + generated)."""

    def logits(self, context: torch.Tensor, pos: int) -> torch.Tensor:
        """[V] float32 next-token logits after `context` ([L] int64), consumed at `pos`."""
        ...


class CheckpointUnavailable(RuntimeError):
    """A real checkpoint is not in the local Hugging Face cache (nothing is downloaded)."""


# --- the probe -----------------------------------------------------------------------------------


class ProbeDecoder:
    """The probe as a decoder: only the newest token and its position matter."""

    name = "probe"

    def __init__(self, spec: ProbeSpec | None = None) -> None:
        self.spec = spec or ProbeSpec()
        self.vocab = self.spec.vocab
        self.max_context = self.spec.max_positions
        self._perm = torch.tensor(permutation(self.spec))
        # Sharp but finite: greedy is the probe function, seeded sampling still has choices.
        self.scale = 2.0

    def logits(self, context: torch.Tensor, pos: int) -> torch.Tensor:
        out = torch.zeros(self.vocab, dtype=torch.float32)
        out[self._perm[(int(context[-1]) + pos) % self.vocab]] = self.scale
        return out


class ProbeDrafter:
    """The probe's drafter as a model: the token its draft table proposes after the newest token
    at `pos` (`drafts.draft_table`), as one-hot logits."""

    def __init__(self, spec: ProbeSpec, drafts: DraftSpec) -> None:
        self.name = "probe-drafter"
        self.vocab = spec.vocab
        self.max_context = spec.max_positions
        self.table = draft_table(spec, drafts)

    def logits(self, context: torch.Tensor, pos: int) -> torch.Tensor:
        # Positions past the table wrap: only a row whose output is never used gets there.
        return self.table[(int(context[-1]) + pos) % self.table.shape[0]]


# --- transformers --------------------------------------------------------------------------------


class HfDecoder:
    """A `transformers` causal LM, full-sequence forward per call, float32, no grad."""

    def __init__(self, name: str, model: Any, max_context: int) -> None:
        self.name = name
        self.model = model.eval()
        self.vocab = int(model.config.vocab_size)
        self.max_context = max_context

    def logits(self, context: torch.Tensor, pos: int) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(input_ids=context.reshape(1, -1), use_cache=False).logits
        return out[0, -1].to(torch.float32)


TINY = TINY_ARCHS
TINY_VOCAB = 256
TINY_CONTEXT = 128
# What sets an architecture apart at toy size. Mistral is Llama plus a sliding window: without
# one (and with the same seed) the two would be the same function, and one case would be moot.
TINY_EXTRA: dict[str, dict[str, Any]] = {"tiny-mistral": {"sliding_window": 8}}


def build_tiny(name: str, seed: int = 0) -> HfDecoder:
    """A real architecture at toy size; weights from `seed` (offset per architecture), so every
    build of one name is identical and no two names share weights."""
    import transformers

    config_class, model_class = TINY[name]
    config = getattr(transformers, config_class)(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=TINY_CONTEXT,
        tie_word_embeddings=False,
        attn_implementation="eager",  # one attention kernel for every run: exact comparisons
        **TINY_EXTRA.get(name, {}),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1000 * seed + list(TINY).index(name))
        model = getattr(transformers, model_class)(config).to(torch.float32)
    return HfDecoder(name, model, TINY_CONTEXT)


CHECKPOINT_CONTEXT = 256  # the serving workloads are short; recompute cost grows with context


def checkpoint_path(name: str) -> str:
    """The local snapshot of checkpoint `name`, or CheckpointUnavailable saying why not."""
    repo = CHECKPOINTS[name]
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo, local_files_only=True)
    except Exception as error:  # the hub raises several kinds for "not cached"
        raise CheckpointUnavailable(
            f"checkpoint {name} ({repo}) is not in the local Hugging Face cache "
            f"({type(error).__name__}); nothing is downloaded"
        ) from None
    if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointUnavailable(f"checkpoint {name} ({repo}): cached snapshot has no config")
    return path


def load_checkpoint(name: str) -> HfDecoder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = checkpoint_path(name)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation="eager",
        local_files_only=True,
        trust_remote_code=name == "internlm2",  # internlm2 ships its modelling code
    )
    limit = getattr(model.config, "max_position_embeddings", None) or CHECKPOINT_CONTEXT
    return HfDecoder(name, model, min(CHECKPOINT_CONTEXT, int(limit)))


def layer_skip(model: HfDecoder) -> HfDecoder:
    """`model` with its later layers skipped: its first half (at least one), then its final norm
    and head, every weight shared with it (nothing is copied). Built on the meta device and
    filled with `model`'s modules, so a checkpoint's drafter costs no memory of its own."""
    import copy

    import transformers

    target = model.model
    config = copy.deepcopy(target.config)
    kept = max(1, int(config.num_hidden_layers) // 2)
    config.num_hidden_layers = kept
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:kept]
    with torch.device("meta"):
        draft = getattr(transformers, type(target).__name__)(config)
    base, inner = target.base_model, draft.base_model
    for name, module in base.named_children():  # embeddings, norm, rotary embedding
        if name != "layers":
            setattr(inner, name, module)
    inner.layers = torch.nn.ModuleList(list(base.layers)[:kept])
    draft.lm_head = target.lm_head
    left = [n for n, t in (*draft.named_parameters(), *draft.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"the layer-skip drafter of {model.name} has unshared parts: {left}")
    return HfDecoder(f"{model.name}-layers-0-{kept - 1}", draft, model.max_context)


def drafter_for(model: DecoderModel, drafts: DraftSpec) -> DecoderModel:
    """The model that proposes `model`'s drafts on the device: the probe's draft table, or a
    `transformers` model with its later layers skipped (`layer_skip`)."""
    if isinstance(model, ProbeDecoder):
        return ProbeDrafter(model.spec, drafts)
    if isinstance(model, HfDecoder):
        return layer_skip(model)
    raise ValueError(f"no drafter for {model.name}: speculative decoding serves the probe and "
                     "transformers models")


def load_model(name: str, seed: int = 0) -> DecoderModel:
    """Model `name`; ValueError if unknown, CheckpointUnavailable if a checkpoint is absent."""
    loaders: dict[str, Callable[[], DecoderModel]] = {
        "probe": lambda: ProbeDecoder(ProbeSpec(seed=seed)),
        **{n: (lambda n=n: build_tiny(n, seed)) for n in TINY},  # type: ignore[misc]
        **{n: (lambda n=n: load_checkpoint(n)) for n in CHECKPOINTS},  # type: ignore[misc]
    }
    if name not in loaders:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(model_names())}")
    return loaders[name]()


MODEL_DIR_FILE = "ttmirror.json"
"""In a model directory written by `write_model_dir`: which of our models it holds."""


def write_model_dir(name: str, path: str, seed: int = 0) -> None:
    """A local model directory for a serving engine that loads models by path (vLLM): the
    `transformers` config (architecture, vocabulary, context, end-of-text id), for a tiny
    architecture its weights, and a character tokenizer (`serving.tokenizer`) with a chat
    template; `MODEL_DIR_FILE` names the model so that `load_model_dir` serves the same one."""
    import json

    import transformers

    from .tokenizer import EOS_ID, write_tokenizer

    os.makedirs(path, exist_ok=True)
    if name == "probe":
        spec = ProbeSpec(seed=seed)
        # The probe has no weights: a config of its vocabulary and context is all a scheduler
        # reads (vLLM: sizes of the KV cache and of requests).
        config = transformers.Qwen3Config(
            vocab_size=spec.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=spec.max_positions, tie_word_embeddings=False,
            eos_token_id=EOS_ID)
        config.architectures = ["Qwen3ForCausalLM"]
        config.save_pretrained(path)
        vocab, context = spec.vocab, spec.max_positions
    elif name in TINY:
        model = build_tiny(name, seed)
        model.model.config.architectures = [TINY[name][1]]
        model.model.config.eos_token_id = EOS_ID
        model.model.save_pretrained(path)
        vocab, context = model.vocab, model.max_context
    else:
        raise ValueError(f"write_model_dir: {name!r} is not the probe or a tiny architecture")
    write_tokenizer(path, vocab, context)
    with open(os.path.join(path, MODEL_DIR_FILE), "w") as f:
        json.dump({"model": name, "seed": seed}, f)


def load_model_dir(path: str) -> DecoderModel:
    """The model of a directory `write_model_dir` wrote: the probe from its seed, a tiny
    architecture from the weights in the directory. ValueError (one line) for any other."""
    import json

    try:
        with open(os.path.join(path, MODEL_DIR_FILE)) as f:
            meta = json.load(f)
        name, seed = meta["model"], int(meta["seed"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a model directory of ttmirror ({MODEL_DIR_FILE}: "
                         f"{e})") from None
    if name == "probe":
        return ProbeDecoder(ProbeSpec(seed=seed))
    if name not in TINY:
        raise ValueError(f"{path}: unknown model {name!r}")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager",
                                                 local_files_only=True)
    return HfDecoder(name, model, TINY_CONTEXT)

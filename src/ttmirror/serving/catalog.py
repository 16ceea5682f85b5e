"""Names of the models the serving loop knows (no torch import: the CLI lists them cheaply)."""

from __future__ import annotations

TINY_ARCHS: dict[str, tuple[str, str]] = {
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "tiny-mistral": ("MistralConfig", "MistralForCausalLM"),
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM"),
}
"""Real `transformers` architectures at toy size: name -> (config class, model class)."""

CHECKPOINTS: dict[str, str] = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "mistral-7b-v0.3": "mistralai/Mistral-7B-v0.3",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "internlm2": "internlm/internlm2_5-1_8b",
}
"""Real checkpoints, served only when they are in the local Hugging Face cache."""


def model_names() -> list[str]:
    return ["probe", *TINY_ARCHS, *CHECKPOINTS]

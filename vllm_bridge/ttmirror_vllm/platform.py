"""The platform vLLM sees: out of tree, host tensors, and our executor for every engine."""

from __future__ import annotations

from typing import Any

from vllm.platforms.interface import Platform, PlatformEnum


class MirrorPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "ttmirror"
    # vLLM's own process keeps only host tensors; the device is the worker's (TT, emulated
    # off hardware).
    device_type = "cpu"
    dispatch_key = "CPU"

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        from .executor import MirrorExecutor

        vllm_config.parallel_config.distributed_executor_backend = MirrorExecutor
        # Prefix caching would let vLLM skip prompt tokens the worker never computed.
        vllm_config.cache_config.enable_prefix_caching = False

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return 1 << 30

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "ttmirror"

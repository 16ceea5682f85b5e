"""The platform vLLM sees: out of tree, host tensors, and our executor for every engine."""

from __future__ import annotations

import logging
from typing import Any

from vllm.platforms.interface import Platform, PlatformEnum

logger = logging.getLogger("ttmirror_vllm")

MAX_ROWS = 32
"""Rows a step may hold on the mirror: `ttnn.sampling` takes at most 32 users (one tile of
rows), as the TT decode stacks batch 32 users."""


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
        from .scheduler import MirrorAsyncScheduler, MirrorScheduler

        vllm_config.parallel_config.distributed_executor_backend = MirrorExecutor
        # vLLM's own schedulers, which end a request the mirror refused with an error of its
        # own (scheduler.py): the platform hook runs after async scheduling is resolved.
        sched = vllm_config.scheduler_config
        if sched.max_num_seqs > MAX_ROWS:
            # vLLM's default is 256; the device's sampler draws for 32 users per call.
            logger.warning("ttmirror: max_num_seqs %d capped at %d: ttnn.sampling draws for "
                           "at most %d users per step on the TT mirror", sched.max_num_seqs,
                           MAX_ROWS, MAX_ROWS)
            sched.max_num_seqs = MAX_ROWS
        if sched.scheduler_cls is None:
            sched.scheduler_cls = (MirrorAsyncScheduler if sched.async_scheduling
                                   else MirrorScheduler)

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Refuse at admission (vLLM's API answers HTTP 400 with this line) a request asking
        for a sampling parameter the mirror does not serve: never ignored silently."""
        from vllm.exceptions import VLLMValidationError  # a client's error: HTTP 400

        from .wire import unsupported

        names = unsupported(params)
        if names:
            raise VLLMValidationError(
                f"the TT mirror does not serve {', '.join(names)} (ttmirror-vllm)",
                parameter=names[0])

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return 1 << 30

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "ttmirror"

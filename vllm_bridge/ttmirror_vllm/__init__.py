"""vLLM on the TT mirror: a platform plugin (`register`, vLLM's `vllm.platform_plugins` entry
point) whose executor runs every step of vLLM's scheduler in a ttmirror worker process.

This package lives in vLLM's environment and imports nothing of ttmirror: the two environments
cannot share numpy (vLLM needs >= 2, ttnn < 2), and the worker is a process of ttmirror's own
Python (`TTMIRROR_PYTHON`), spoken to in plain values.
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = ("0.33.0",)
"""vLLM releases whose `SchedulerOutput` and `ModelRunnerOutput` the bridge translates."""
ENABLE = "TTMIRROR_VLLM"
"""The platform activates only where this is set (to 1): installing the plugin changes no other
vLLM run in the environment."""


def register() -> str | None:
    """vLLM's platform plugin hook: our platform's qualified name, when enabled."""
    if os.environ.get(ENABLE) != "1":
        return None
    return "ttmirror_vllm.platform.MirrorPlatform"


def check_version() -> None:
    """RuntimeError, one line, unless the installed vLLM is one the bridge knows."""
    import vllm

    if vllm.__version__ not in SUPPORTED_VLLM:
        raise RuntimeError(f"ttmirror-vllm translates vLLM {', '.join(SUPPORTED_VLLM)}; this is "
                           f"vLLM {vllm.__version__}: install a supported one")

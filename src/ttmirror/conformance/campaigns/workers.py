"""Worker processes for the walks: started fresh, one core each, stopped with a message or killed.

Shared by the planned walks (`walks.py`) and the branch walks (`branches.py`): each worker is a
spawned interpreter (torch and fork do not mix) talking to the master over one pipe.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any


@dataclass
class Workers:
    """Started worker processes and the master's end of each one's pipe."""

    conns: list[Connection] = field(default_factory=list)
    procs: list[Any] = field(default_factory=list)

    @classmethod
    def start(cls, target: Callable[..., None], args: list[tuple[Any, ...]]) -> Workers:
        """One process per entry of `args`, running `target(*args[i], conn)`."""
        ctx = multiprocessing.get_context("spawn")
        workers = cls()
        for worker_args in args:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*worker_args, child), daemon=True)
            proc.start()
            child.close()
            workers.conns.append(parent)
            workers.procs.append(proc)
        return workers

    def stop(self, *, kill: bool, goodbye: object) -> None:
        """Send each worker `goodbye` (or kill them all), wait for them, close the pipes."""
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if kill:
                proc.terminate()
            else:
                try:
                    conn.send(goodbye)
                except (BrokenPipeError, OSError):
                    proc.terminate()
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for conn in self.conns:
            conn.close()


def one_core() -> None:
    """What a worker does first: quiet logs, and one torch thread (the workers are the
    parallelism)."""
    os.environ.setdefault("LOGURU_LEVEL", "WARNING")
    import torch

    torch.set_num_threads(1)

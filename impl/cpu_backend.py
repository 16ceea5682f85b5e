"""The cpu backend: torch on the host, synchronous, with the same ring and combine as a device.

Everything completes at once, so there is nothing to overlap; it still keeps sampled ids in a
ring of K slots and combines from them through the previous-row map, exactly like the TT
mirror. That is why it may advertise the capability (as the engine's CPU backend does): the
depth-2 pipeline's bookkeeping is the same, and its output is the reference for the TT one.
"""

from __future__ import annotations

from typing import Any

import torch

from .backend import Backend, Mirror, MirrorSpec, StepInputs, TokenLogprobs, padded_rows
from .probe import UINT32_MASK, forward_torch, logits_table, sample_torch


class CpuMirror:
    def __init__(self, spec: MirrorSpec) -> None:
        self.spec = spec
        rows = padded_rows(spec.rows)
        self.ring = [torch.zeros(rows, dtype=torch.int64) for _ in range(spec.slots)]
        self.table = logits_table(spec.probe)
        zeros = torch.zeros(rows, dtype=torch.int64)
        self._host_ids, self._prev_map, self._use_mirror, self._positions, self._requests = (
            zeros.clone() for _ in range(5)
        )
        self.input_ids = zeros.clone()
        """What the forward consumes: the combine's output."""
        self.launches = 0

    def stage(self, inputs: StepInputs) -> None:
        n = len(inputs.host_ids)
        # Ids are uint32 on a device: a -1 placeholder wraps exactly as it does there.
        self._host_ids[:n] = torch.tensor(inputs.host_ids) & UINT32_MASK
        self._prev_map[:n] = torch.tensor(inputs.prev_map)
        self._use_mirror[:n] = torch.tensor(inputs.use_mirror)
        self._positions[:n] = torch.tensor(inputs.positions)
        if inputs.requests:
            self._requests[:n] = torch.tensor(inputs.requests)

    def combine(self, slot: int) -> None:
        source = self.ring[(slot - 1) % self.spec.slots]
        gathered = torch.gather(source, 0, self._prev_map)
        self.input_ids = torch.where(self._use_mirror > 0, gathered, self._host_ids)

    def launch(self, slot: int) -> None:
        seed = self.spec.probe.sampling
        if seed is None:
            self.ring[slot] = forward_torch(self.table, self.input_ids, self._positions)
        else:
            self.ring[slot] = sample_torch(self.table, self.input_ids, self._positions,
                                           self._requests, seed)
        self.launches += 1

    def readback_issue(self, slot: int) -> Any:
        return self.ring[slot].clone()  # the copy is the readback: synchronous on the host

    def readback_complete(self, pending: Any) -> list[int]:
        return [int(v) for v in pending.tolist()]

    def readback_logprobs(self, pending: Any) -> list[TokenLogprobs]:
        raise RuntimeError("the probe forward computes no logprobs (MirrorSpec.logprobs)")

    def abandon(self, pending: Any) -> None:
        pass  # the copy was made on the host at issue: nothing is still writing into it

    def describe(self) -> dict[str, Any]:
        return {"launches": self.launches, "trace": False}

    def close(self) -> None:
        pass


class CpuBackend(Backend):
    name = "cpu"

    def supports_async_sampled_token_readback(self) -> bool:
        return True

    def device_kind(self) -> str:
        return "cpu"

    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        if spec.trace:
            raise ValueError("the cpu backend has no traces: open the mirror with trace=False")
        if spec.logprobs:
            raise ValueError("the probe forward computes no logprobs: open the mirror with "
                             "logprobs=0, or serve a decoder model (ServingBackend)")
        return CpuMirror(spec)

    def info(self) -> dict[str, Any]:
        return {"torch": torch.__version__}

"""Where the serving engine's decoder op comes from on a TT device: one seam, by device kind.

The mirror's launch runs a decoder model's forward and sampler as device ops (`DeviceDecoder`'s
interface below). No ttnn kernel computes a `transformers` model, so what can run one is
declared from outside, in the entry point group ``ttmirror.serving.decoders``: its name is the
device kind (`impl.devices`), its object a class built as ``(device, model, width, blocks,
sampling)``. The emulated device declares one (`ttmirror.emulator.decoder`); a chip has none
here: a TT model stack's own decode would take its place.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

GROUP = "ttmirror.serving.decoders"

Decoder = Callable[..., Any]
"""``(device, model, width, blocks, sampling) -> decoder`` with `stage(rows)` and
`forward(input_ids, positions, slot, logprobs=None)`."""


class NoDecoder(NotImplementedError):
    """No decoder op is declared for the device's kind (a chip: no ttnn kernel computes a
    `transformers` model); a NotImplementedError, so the runner's load lets it through as "no
    such path here", not as a device fault."""


@functools.cache
def decoder_for(kind: str) -> Decoder:
    """The decoder op declared for devices of `kind`; `NoDecoder` (one line, naming the kinds
    that have one) when it has none."""
    found = {e.name: e for e in importlib.metadata.entry_points(group=GROUP)}
    if kind not in found:
        have = ", ".join(sorted(found)) or "none"
        raise NoDecoder(f"the serving forward runs as an emulated-device op; on a {kind} device "
                        "it needs the TT model stack's decode, which is not part of ttmirror "
                        f"(use the emulated device; {GROUP} declares: {have})")
    decoder: Decoder = found[kind].load()
    return decoder

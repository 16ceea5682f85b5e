"""The rig: an emulated device, the mirror's backend on it, and a serving engine over them, built
one way for every harness (the lockstep, the kill matrix's halves, the serving loop, the soak),
benchmark and test fixture.

    device = open_rig("mirror", scheduler=lambda: SeededScheduler(7))
    engine = serving_engine(device, model, ServingConfig(rows=6), SamplingParams(seed=1))

A device's DRAM is one of the named sizes (`SIZES`), with `model` the decoder's own tables on top;
a device opens emulated unless `chip=True` and a chip is present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ttmirror.emulator import Emulator, ManualScheduler, open_device
from ttmirror.emulator.decoder import dram_bytes
from ttmirror.emulator.device import DEFAULT_DRAM_SIZE, Scheduler
from ttmirror.emulator.hazards import HazardMode
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import ServingConfig, ServingEngine
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.models import DecoderModel

Size = Literal["tiny", "mirror", "serving", "default"]
SIZES: dict[str, int] = {
    "tiny": 1 << 20,  # the mirror at a few rows: the lockstep, the allocator's runs, op tests
    "mirror": 4 << 20,  # the mirror with drafts and logprobs at twenty rows: the runner's tests
    "serving": 16 << 20,  # the serving loop's engine, before the decoder's own tables
    "default": DEFAULT_DRAM_SIZE,  # what the entry point's provider opens
}
"""DRAM bytes by name."""
TRACE_REGION = 1 << 20
"""The trace region every rig device has: room for the decode traces of the mirror's tests."""


def open_rig(size: Size = "tiny", *, scheduler: Callable[[], Scheduler] = ManualScheduler,
             hazard_mode: HazardMode = "raise", queues: int = 2, process: bool = False,
             planted: frozenset[str] = frozenset(), model: DecoderModel | None = None,
             model_rows: int = 0, trace_region: int = TRACE_REGION, chip: bool = False) -> Any:
    """An emulated 1x1 mesh device of `size` DRAM (plus `model`'s tables for `model_rows`
    rows), completed as `scheduler` says (in a device process of its own with `process`); the
    chip instead when `chip` and one is present."""
    dram = SIZES[size] + (dram_bytes(model, model_rows, model_rows) if model else 0)
    return open_device(
        num_command_queues=queues, trace_region_size=trace_region,
        emulator=Emulator(scheduler=scheduler, hazard_mode=hazard_mode, dram_size=dram,
                          planted=planted, process=process),
        emulated=None if chip else True)


def serving_engine(device: Any, model: DecoderModel, config: ServingConfig,
                   sampling: SamplingParams | None = None) -> ServingEngine:
    """The serving engine a deployment runs: `model` on the mirror's backend on `device`."""
    return ServingEngine(ServingBackend(TtBackend(device), model, sampling), config)

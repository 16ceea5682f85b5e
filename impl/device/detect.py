"""Is a Tenstorrent chip present? Decided once per process, cheaply and without side effects."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import ttnn

# TTMIRROR_DEVICE=emulated forces the emulated device even where a chip exists (e.g. to compare).
OVERRIDE_VARIABLE = "TTMIRROR_DEVICE"


@functools.cache
def chip_count() -> int:
    """Number of chips ttnn can open; 0 means the emulated device must be used."""
    if os.environ.get(OVERRIDE_VARIABLE) == "emulated":
        return 0
    # Without the kernel driver's device nodes there is no chip. Checking them first avoids
    # ttnn.GetNumAvailableDevices, which builds the cluster and logs a TT_FATAL when it is empty.
    if not Path("/dev/tenstorrent").exists():
        return 0
    try:
        return int(ttnn.GetNumAvailableDevices())
    except RuntimeError as error:  # raised as "TT_FATAL ... No chips detected in the cluster"
        if "No chips detected" in str(error) or "num_chips > 0" in str(error):
            return 0
        raise


def chip_present() -> bool:
    return chip_count() > 0

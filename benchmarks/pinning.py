"""`--pin` for the benchmarks: this process on one core, the device process on the others, as a
host and a chip each have their own; one rule for every benchmark that starts a device process."""

from __future__ import annotations

import argparse
import os


def add_pin(parser: argparse.ArgumentParser, *, default: bool | None, why: str) -> None:
    """The `--pin/--no-pin` option; `default` None: pin where there are two cores or more."""
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=default,
                        help="this process on one core, the device process on the others "
                             f"({why})")


def split_cores(parser: argparse.ArgumentParser, pin: bool | None
                ) -> tuple[frozenset[int], frozenset[int]] | None:
    """(this process's cores, the device process's) when pinning, else None; a usage error
    where there is only one core to pin to."""
    cores = sorted(os.sched_getaffinity(0))
    if pin is None:
        pin = len(cores) >= 2
    if not pin:
        return None
    if len(cores) < 2:
        parser.error(f"--pin needs two cores or more; this process may run on {cores}")
    return frozenset(cores[:1]), frozenset(cores[1:])

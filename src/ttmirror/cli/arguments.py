"""What every `ttmirror` subcommand shares: `UsageError`, the parser, the bounds options, output.

`cli.py` and each module that adds subcommands (`cli_conformance.py`, `cli_serving.py`) import
from here; none of them imports another's names.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from ttmirror.conformance import bugs
from ttmirror.model.state import SPEC_VARIANTS, VARIANTS, Bounds, validate_bounds

DEFAULTS = Bounds()

AddParser = Callable[..., argparse.ArgumentParser]
"""The subcommands' `add_parser`: what a module's `register(add_parser)` adds its commands with."""


class UsageError(Exception):
    """Bad arguments or input: reported in one line, exit 2."""


def planted_bug(given: str | None = None) -> str | None:
    """`conformance.bugs.planted_bug` (an option, else $TTMIRROR_BUG), an unknown one a
    UsageError."""
    try:
        return bugs.planted_bug(given)
    except ValueError as e:
        raise UsageError(str(e)) from None


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are `UsageError`s (one line, exit 2), not exits."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_bounds(p: argparse.ArgumentParser) -> None:
    """The model's bounds and feature switches, as options of `p`."""
    g = p.add_argument_group("bounds")
    g.add_argument("--depth", type=int, default=DEFAULTS.depth,
                   help="max_concurrent_batches D: 1 (sync), 2 (async), 3 or 4 (pipeline "
                   "parallelism of that size) (default %(default)s)")
    g.add_argument("--slots", type=int, default=DEFAULTS.slots,
                   help="mirror slots K in the ring (default %(default)s)")
    g.add_argument("--state", choices=("ring", "rows"), default=DEFAULTS.state,
                   help="where in-flight tokens live on the device: ring (a step's slot, read "
                        "through the previous-row map) or rows (a state row per request) "
                        "(default %(default)s)")
    g.add_argument("--state-rows", type=int, default=DEFAULTS.state_rows,
                   help="with --state rows: state rows on the device (default: one per request)")
    g.add_argument("--requests", type=int, default=DEFAULTS.requests,
                   help="requests (default %(default)s)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help=f"tokens per request (default {DEFAULTS.max_tokens}; "
                        f"{SPEC_MAX_TOKENS} with --spec-tokens, so that a step reads a position "
                        "the device advanced by its accepted count)")
    g.add_argument("--preemptions", type=int, default=DEFAULTS.preemptions,
                   help="preemptions per request (default %(default)s)")
    t = p.add_argument_group("features and variants")
    bool_flag = argparse.BooleanOptionalAction
    t.add_argument("--finish", action=bool_flag, default=DEFAULTS.finish,
                   help="stop tokens: early finish known only after readback")
    t.add_argument("--abort", action=bool_flag, default=DEFAULTS.abort, help="user aborts")
    t.add_argument("--preempt", action=bool_flag, default=DEFAULTS.preempt, help="preemption")
    t.add_argument("--condense", action=bool_flag, default=DEFAULTS.condense,
                   help="rows may be condensed/reordered between steps")
    t.add_argument("--guard", action=bool_flag, default=DEFAULTS.guard,
                   help="the stale-host-ids guard (--no-guard: the known-bad variant)")
    t.add_argument("--release-at", choices=("complete", "issue"), default=DEFAULTS.release_at,
                   help="when a slot may be released: readback complete (correct) or issue "
                        "(known-bad)")
    t.add_argument("--preempt-policy", choices=("keep", "drop"), default=DEFAULTS.preempt_policy,
                   help="a preempted request's in-flight tokens: keep (vLLM's: delivered, and "
                        "the request resumes once it owns no placeholder) or drop "
                        "(default %(default)s)")
    t.add_argument("--prefill-chunks", type=int, default=None,
                   help="chunks of each first prefill, all but the last discarded "
                        f"(default {DEFAULTS.prefill_chunks}: no chunking; 2 with "
                        "--variant partial-prefill-feeds-mirror)")
    t.add_argument("--host-sync", action=bool_flag, default=None,
                   help="request 0 needs its newest token on the host before its next step "
                        "(default off; on with --variant host-sync-unguarded)")
    t.add_argument("--faults", action=bool_flag, default=None,
                   help="the device may fail any step before its readback completes "
                        "(default off; on with --variant fault-spares-later-rows)")
    t.add_argument("--subsets", action=bool_flag, default=DEFAULTS.subsets,
                   help="vLLM's scheduler freedoms: a step holds any non-empty subset of the "
                        "schedulable requests, each decoding row any number of its drafts "
                        f"(default {'on' if DEFAULTS.subsets else 'off'})")
    t.add_argument("--spec-tokens", type=int, default=None,
                   help="K draft tokens per decoding row, verified on the device "
                        f"(default {DEFAULTS.spec_tokens}: no drafts; 1 with a spec-decode "
                        "--variant)")
    t.add_argument("--variant", choices=(*VARIANTS, *OLD_VARIANTS), default="",
                   help="a known-bad variant: " + "; ".join(
                       f"{k}: {v}" for k, v in {**VARIANTS, **OLD_VARIANTS}.items()))


SPEC_MAX_TOKENS = 3
"""The default tokens per request with drafts: a prefill, a drafted step, and a step whose
position the device advanced by the drafted step's accepted count."""

OLD_VARIANTS = {
    "guard-off": "no stale-host-ids guard (also --no-guard)",
    "release-at-issue": "a slot released once its readback is issued (also --release-at issue)",
}
"""The earlier bad variants, also reachable through their own options."""


def bounds_from(ns: argparse.Namespace) -> Bounds:
    """The bounds `add_bounds` parsed, checked: impossible ones are a `UsageError`."""
    variant = ns.variant
    chunks = ns.prefill_chunks
    if chunks is None:  # a variant that needs chunking gets the smallest that shows it
        chunks = 2 if variant == "partial-prefill-feeds-mirror" else DEFAULTS.prefill_chunks
    host_sync = ns.host_sync
    if host_sync is None:
        host_sync = variant == "host-sync-unguarded"
    faults = ns.faults
    if faults is None:
        faults = variant == "fault-spares-later-rows"
    spec = ns.spec_tokens
    if spec is None and variant in SPEC_VARIANTS:
        spec = 1
    if spec is None:
        spec = 1 if variant == "draft-count-of-another-row" else DEFAULTS.spec_tokens
    b = Bounds(
        depth=ns.depth, slots=ns.slots, requests=ns.requests,
        max_tokens=ns.max_tokens if ns.max_tokens is not None
        else SPEC_MAX_TOKENS if spec else DEFAULTS.max_tokens,
        preemptions=ns.preemptions, finish=ns.finish, abort=ns.abort, preempt=ns.preempt,
        condense=ns.condense, guard=ns.guard and variant != "guard-off",
        release_at="issue" if variant == "release-at-issue" else ns.release_at,
        preempt_policy=ns.preempt_policy, prefill_chunks=chunks, host_sync=host_sync,
        variant=variant if variant in VARIANTS else "", faults=faults, spec_tokens=spec,
        state=ns.state, state_rows=ns.state_rows, subsets=ns.subsets,
    )
    if ns.preemptions < 0:
        raise UsageError(f"--preemptions must be 0 or more, got {ns.preemptions}")
    try:
        validate_bounds(b)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return b


def mkdir(path: Path) -> None:
    """Create `path` and its parents, or fail in one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {path}: {e.strerror}") from None


def writable(output: str | None) -> None:
    """Fail in one line, before any work starts, if the file `output` cannot be written (None
    or "-": stdout). Probes with the temporary name `emit` writes through, then removes it."""
    if output is None or output == "-":
        return
    path = Path(output)
    if path.is_dir():
        raise UsageError(f"cannot write {output}: it is a directory")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w"):
            pass
        tmp.unlink()
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e.strerror}") from None


def writable_dir(folder: str | None) -> None:
    """Fail in one line, before any work starts, if files cannot be written in `folder`
    (created if missing; None: nowhere to write)."""
    if folder is None:
        return
    mkdir(Path(folder))
    writable(str(Path(folder) / ".ttmirror-probe"))


def emit(text: str, output: str | None) -> None:
    """Write `text` to stdout (None or "-") or, atomically, to the file `output`."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    path = Path(output)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)  # never leave a half-written file in place of a good one
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e.strerror}") from None

"""Subcommands for fuzz, mutants and replay (the conformance suite)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands to the `ttmirror` parser (none yet)."""

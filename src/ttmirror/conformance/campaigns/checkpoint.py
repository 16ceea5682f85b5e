"""A long campaign's progress on disk, so that it can span runs (`fuzz --checkpoint FILE`).

The branch walks of a spec-decode bound take hours on two cores. A checkpoint holds what a run
established and nothing it did not: the edges walked and checked (the ids of `shards.py`), the
actions they took, and the counts behind the report's figures. A later run of the same campaign
(backend, configuration, seed, bounds, planted bug) marks those edges covered, skips the
Hypothesis phase it already ran, and walks only branches from which an uncovered edge can still
be reached. The file is replaced atomically, so a run stopped at any moment leaves the last
complete checkpoint behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ttmirror.conformance.campaigns.coverage import Coverage, edge_pairs
from ttmirror.conformance.campaigns.shards import decode_ids, edge_ids, encode_ids

VERSION = 1


@dataclass
class Progress:
    """The totals of the runs before this one (all zero for a campaign's first run)."""

    runs: int = 0
    steps: int = 0
    walks: int = 0
    passes: int = 0
    walk_seconds: float = 0.0
    hypothesis_examples: int = 0
    observation: str = ""
    """What the first run's abstraction could see (the report repeats it)."""
    edges: int = 0
    """Edges covered when this run started from the checkpoint."""


@dataclass
class Checkpoint:
    campaign: dict[str, Any]
    """backend, config, seed, bounds, bug: a checkpoint is resumed only by the same campaign."""
    covered_edges: str
    actions: list[str]
    progress: Progress = field(default_factory=Progress)


def campaign_key(backend: str, config: str, seed: int, bounds: dict[str, Any],
                 bug: str | None) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed (as JSON reads it back: lists, not
    tuples)."""
    key = {"backend": backend, "config": config, "seed": seed, "bounds": bounds, "bug": bug}
    return json.loads(json.dumps(key))  # type: ignore[no-any-return]


def load(path: Path, campaign: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint at `path` (None if there is none); ValueError, in one line, if it is not a
    checkpoint or belongs to another campaign."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, this ttmirror writes {VERSION}")
        cp = Checkpoint(data["campaign"], data["covered_edges"], list(data["actions"]),
                        Progress(**data["progress"]))
        decode_ids(cp.covered_edges)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--checkpoint {path}: not a fuzz checkpoint ({e}); move it away to "
                         "start afresh") from None
    if cp.campaign != campaign:
        differ = sorted(k for k in campaign if cp.campaign.get(k) != campaign[k])
        raise ValueError(f"--checkpoint {path} is another campaign's (different: "
                         f"{', '.join(differ)}); give this campaign its own file")
    return cp


def apply(cp: Checkpoint, cov: Coverage) -> None:
    """Mark the checkpoint's edges and actions covered in `cov` (the same bounds' graph)."""
    pairs = edge_pairs(cov.ex)
    ids = decode_ids(cp.covered_edges)
    if ids and ids[-1] >= len(pairs):
        raise ValueError("the checkpoint names an edge the graph does not have")
    cov.edges.update(pairs[k] for k in ids)
    cov.actions.update(cp.actions)
    cp.progress.edges = len(cov.edges)


def save(path: Path, campaign: dict[str, Any], cov: Coverage, progress: Progress) -> None:
    """Write the campaign's coverage and totals so far to `path`, replacing it atomically."""
    data = {"version": VERSION, "campaign": campaign,
            "covered_edges": encode_ids(edge_ids(cov)), "actions": sorted(cov.actions),
            "progress": asdict(progress)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)

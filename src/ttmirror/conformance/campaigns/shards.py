"""A campaign's walks split over machines: which shard takes which walk, the covered edges as
compact text in each shard's report, and the reports merged.

Edge ids are positions in the sorted list of the explored graph's (source, target) pairs, the
numbering the walk planner uses: the same on every machine for the same bounds. A set of ids
travels as the base64 of the zlib of its sorted gaps (little-endian uint32).
"""

from __future__ import annotations

import base64
import random
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ttmirror.conformance.campaigns.coverage import Coverage, Planner, edge_pairs


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` -> (I, N), 1 <= I <= N; ValueError (one line) otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: write it I/N, as in 1/4") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard {text}: I must be between 1 and N")
    return i, n


def encode_ids(ids: Iterable[int]) -> str:
    """Sorted ids as compact text."""
    values = np.array(sorted(set(ids)), dtype=np.int64)
    gaps = np.diff(values, prepend=0).astype("<u4")
    return base64.b64encode(zlib.compress(gaps.tobytes(), 9)).decode("ascii")


def decode_ids(text: str) -> list[int]:
    """`encode_ids`' text back to the sorted ids; ValueError if it is not such text."""
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, zlib.error) as e:
        raise ValueError(f"not an encoded id list ({e})") from None
    if len(raw) % 4:
        raise ValueError("not an encoded id list (length)")
    return np.cumsum(np.frombuffer(raw, dtype="<u4").astype(np.int64)).tolist()


def edge_ids(cov: Coverage) -> list[int]:
    """The covered edges' ids (positions among the sorted edges)."""
    position = {pair: k for k, pair in enumerate(edge_pairs(cov.ex))}
    return sorted(position[e] for e in cov.edges)


def merge(reports: list[Mapping[str, Any]], cov: Coverage, seed: int) -> dict[str, Any]:
    """The union of the reports' covered edges on `cov`'s graph (which must be theirs), and how
    many more walks the planner (seeded by `seed`) needs for the rest."""
    pairs = edge_pairs(cov.ex)
    union: set[int] = set()
    for r in reports:
        ids = decode_ids(r["covered_edges"])
        if ids and ids[-1] >= len(pairs):
            raise ValueError("a report names an edge the graph does not have")
        union.update(ids)
    cov.edges = {pairs[k] for k in union}
    planner = Planner(cov, random.Random(seed))
    needed = 0
    while planner.plan() is not None:
        needed += 1
    taken = [w for r in reports if r.get("walks_taken") for w in decode_ids(r["walks_taken"])]
    return {
        "reports": len(reports),
        "edges_covered": round(len(union) / len(pairs), 4) if pairs else 1.0,
        "edges": len(union),
        "total_edges": len(pairs),
        "walks_still_needed": needed,
        "walks_taken": len(taken),
        "walks_taken_twice": len(taken) - len(set(taken)),
    }

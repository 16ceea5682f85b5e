"""What the package ships beside its code, read through `importlib.resources`: the design spec,
the TLA+ twin and its configs, the manifest and the regression traces (`specs/`, the traces in
`specs/regressions/`) and the review site's assets (`report/assets/`).

Installed or editable, each is a folder on disk (the package is never run zipped), so TLC and
Graphviz can be pointed at its files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped(*parts: str) -> Path:
    """A file or folder the package ships, by its path below `ttmirror/`."""
    resource = files("ttmirror").joinpath(*parts)
    if not isinstance(resource, Path):  # a zipped install: nothing here reads one
        raise RuntimeError(f"ttmirror/{'/'.join(parts)} is not on disk (a zipped install?)")
    return resource


SPECS = shipped("specs")
"""The design spec, the TLA+ twin with a .cfg per bound, and the manifest."""
SPEC = SPECS / "mirrored-sampled-ids.md"
TLA = SPECS / "MirroredSampledIds.tla"
MANIFEST = SPECS / "manifest.json"
REGRESSIONS = SPECS / "regressions"
"""The regression traces (ITF) that `ttmirror replay` and the report's step tables read."""
REVIEW_ASSETS = shipped("report", "assets")

"""Keep the generated parts of specs/ up to date: the slot lifecycle and the TLC configs.

`python -m ttmirror.specdoc` rewrites the block between the markers; a test fails when the
committed copy differs from what the model generates.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .model.explore import Exploration, explore
from .model.state import Bounds
from .render import to_mermaid
from .tlc import write_configs
from .views import project

SPEC = Path(__file__).resolve().parent.parent / "specs" / "mirrored-sampled-ids.md"
BEGIN = "<!-- BEGIN GENERATED slot-lifecycle (python -m ttmirror.specdoc) -->"
END = "<!-- END GENERATED slot-lifecycle -->"


def block(ex: Exploration) -> str:
    """The Mermaid block for slot 0 at the given exploration's bounds."""
    return f"{BEGIN}\n```mermaid\n{to_mermaid(project(ex, 'slot', 0))}```\n{END}"


def current(text: str) -> str:
    """The generated block as committed in the spec text."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main() -> int:
    text = SPEC.read_text()
    fresh = block(explore(Bounds()))
    SPEC.write_text(text.replace(current(text), fresh))
    print(f"updated {SPEC}")
    for path in write_configs():
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One row of a step, as the implementation knows it: the one record of a row.

The runner keeps its in-flight steps' rows as these, its view (`Runner.abstract()`) shows them,
its recorded events carry them (`events.py`), the combine stages its device inputs from them
(`backend.StepInputs`) and the serving engine builds its per-step context tables from them. The
model's `Row` (`ttmirror.model.state`) is the only other record of a row; the abstraction maps
one onto the other field by field.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    """Which request a row serves, the input it consumes, and where that input comes from."""

    req: int
    pos: int
    """Position of the input token the row consumes (0 = the prompt's last token)."""
    prev_row: int | None
    """Row of `req` in the previous step's slot (the previous-row map); None = host ids."""
    live: bool = True
    """False once its request finished, aborted, failed or was preempted (drop): its token is
    dropped."""
    partial: bool = False
    """A partial-prefill row: it consumes a prompt chunk and its sampled id is discarded."""
    host_pos: int | None = None
    """Set by the combine: the position whose host id it staged for this row (None: not combined
    yet, reads the mirror, or dropped)."""
    host_id: int = 0
    """Set by the combine with `host_pos`: that host id (a prompt's, a delivered token's, or the
    placeholder)."""
    spec: int = 0
    """Drafts scheduled after the newest token (spec rule 13): K for a decoding row that was in
    the previous step past its prompt, else 0. With drafts a mirror row's `pos` is -1: its
    position is on the device, as its newest token and drafts are."""
    drafts: tuple[int, ...] = ()
    """A host row's drafts, staged by the host from the last readback (a mirror row's are on
    the device)."""
    idx: int = -1
    """With state rows (spec rule 14): the row's `idx_mapping` entry, its request's state row,
    which its combine gathers from (when it reads the device: `prev_row` is then `idx`) and its
    launch's post-update scatters into, dropped or not; -1 with the ring."""

    @property
    def from_mirror(self) -> bool:
        """It consumes its newest token from the device (the guard's rows): the previous step's
        slot (the ring), or its state row (state rows)."""
        return self.live and self.prev_row is not None

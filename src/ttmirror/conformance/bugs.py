"""The catalog of planted bugs: each id, and what goes wrong when it is planted.

Each entry is one real bug class from the async-scheduling and ttnn runtime references; the
conformance suite must rediscover every one ("a checker that cannot rediscover known bugs proves
nothing when it is green"). How each is planted (overrides of named decision methods of `impl/`,
so the code that runs on a chip has no planted branch) is `planted.py`; this module is data
only, so the command line can name the bugs without loading a device.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

BUGS: dict[str, str] = {
    "guard-off": "schedule: no previous-row map, in-flight rows combine from host placeholders",
    "prev-row-not-remapped": "schedule: the previous-row map keeps the new row index after a "
    "reorder (rows assumed not to move)",
    "prev-row-skips-dropped": "schedule: the previous-row map counts only live rows, so a row "
    "after a dropped one reads its neighbour",
    "release-at-issue": "release: a slot is handed back once its readback is only issued",
    "release-when-draining": "release: while nothing is eligible (the pipeline drains), a slot "
    "is handed back once its readback is only issued",
    "release-under-combine": "release: a slot is handed back while the next combine still reads it",
    "combine-before-launch": "combine: runs before the previous step's sampler wrote its slot",
    "deliver-dropped": "apply: tokens of rows dropped by finish, abort or preemption are delivered",
    "stale-host-id-on-resume": "combine: a resumed request's host id is one position stale",
    "host-read-before-event": "readback_complete (tt): the host copy is read before its event",
    "readback-cq1-no-wait": "readback_issue (tt): CQ1 copies the slot without waiting for the "
    "launch event",
    "ring-reuse-k1": "launch (tt): the sampler always writes ring slot 0 (K=1 reuse, no check)",
    "stage-cq1-no-event": "combine (tt): host inputs written on CQ1 with no event before the "
    "combine on CQ0",
    "prev-row-two-back": "schedule: the previous-row map takes each request's row from the last "
    "applied step: two steps back while the previous step is in flight",
    "where-swapped": "combine (tt): where's operands swapped: mirror rows take host ids, host "
    "rows the gathered ids",
    "mask-inverted": "combine (tt): the use-mirror mask staged inverted",
    "gather-off-by-one": "combine (tt): the gather index is the previous-row map plus one",
    "gather-current-slot": "combine (tt): gathers from the slot the step is about to write, not "
    "the previous step's",
    "positions-stale": "combine (tt): the positions tensor holds the previous step's positions",
    "sampler-keyed-by-row": "launch (tt): the seeded sampler's draw is keyed by the batch row, "
    "not the request",
    "sampler-keyed-by-step": "launch (tt): the seeded sampler's draw is keyed by a device step "
    "counter, not the position",
    "resume-with-placeholder": "resume: a preempted request (keep) resumes while its in-flight "
    "token is still owed, so its prefill reads a host placeholder",
    "partial-prefill-feeds-mirror": "schedule: the previous-row map takes a partial-prefill "
    "row, whose sampled id is discarded",
    "host-sync-unguarded": "schedule: a host-sync request is scheduled while its step is in "
    "flight, from host ids that lack its newest token",
    "prev-row-by-id-rank": "schedule: the previous-row map takes a request's rank by id among "
    "the previous step's rows as its row (right only while the engine keeps rows in id order)",
    # Speculative decoding (spec rule 13): each needs drafts (`mutants.NEEDS_BOUNDS`).
    "positions-advance-by-spec": "launch: the device advances a row's position by the 1 + "
    "spec tokens it was scheduled, not by the a + 1 it accepted",
    "bonus-token-dropped": "launch: the count is the accepted drafts alone, so the row "
    "yields them without the target's token after them (and its position lags one behind)",
    "rejected-draft-delivered": "launch: the slot's run is written from the draft inputs (the "
    "target's token only after the last), so where verification rejected a draft, that draft "
    "is delivered instead of the target's token",
    "reentering-drafts-from-device": "schedule: a request re-entering past its prompt "
    "(resumed, or absent from the previous step) is scheduled with K placeholder drafts "
    "for the device to fill; the device holds none for it",
    "host-drafts-placeholder": "combine: a host row's draft lanes are staged as the "
    "async scheduler's -1 placeholders, not the drafts read back, so a placeholder draft "
    "reaches the input ids",
    "count-from-wrong-row": "readback_complete: each row's accepted count is read from the "
    "next row of the copy",
    "draft-part-previous-slot": "launch: the draft part (tokens, count, position, drafts) "
    "is written into the previous step's slot, the one its combine just read, while that "
    "slot's readback may still be outstanding",
    # vLLM's scheduler freedoms (spec rule 14): each needs subsets (`mutants.NEEDS_BOUNDS`).
    "draft-count-of-another-row": "combine: every row's scheduled drafts are staged as the "
    "first row's, so a row that carries fewer drafts than another is verified with its count",
    "skipped-from-previous-step": "schedule: a request the previous step left out is mapped to "
    "its row in the last step that held it, and combined from the previous step's slot there",
    # Per-request state rows (spec rule 14): each needs state rows (`mutants.NEEDS_BOUNDS`).
    "state-row-reused-in-flight": "release_row: a closed request's state row goes back while a "
    "step of it is in flight, whose launch then scatters into the row's next owner's state",
    "idx-from-previous-order": "schedule: each row's idx_mapping entry is the state row the "
    "previous step's row at its place named, so a reordered row gathers another's state",
}
"""Bug id -> what goes wrong. Ids marked (tt) only exist on the tt backend."""

SERVING_BUGS: dict[str, str] = {
    "logprobs-after-event": "readback_issue (tt): the logprob ring is copied after the readback's "
    "event is recorded, so synchronising the event does not cover it",
    "last-chunk-stays-partial": "chunk_prefill: the chunk that ends a request's prefill is marked "
    "partial, so the prefill never ends and the loop reschedules it forever (a livelock)",
}
"""Bugs of what only a serving loop has (the logprob ring, prefill chunks sized per step): the
conformance lockstep drives the probe, which computes no logprobs, and never sizes chunks, so the
serving half (`conformance/serving.py`) kills these; `ttmirror mutants` lists them beside the
lockstep's, `by: serving`."""

FAULT_HANDLING_BUGS: dict[str, str] = {
    "fault-spares-later-rows": "fail_step: the failed requests' rows in the other in-flight step "
    "stay live, so a failed request is delivered a token",
    "fault-keeps-ring-position": "fail_step: a failed newest step does not give its slot back to "
    "the ring position, so the next step takes the older in-flight step's slot",
    "fault-drops-pending-copy": "fail_step: the failed step's readback copy is dropped, not "
    "left to the mirror, while the device may still write into it",
    "event-before-device-call": "launch: the launch event is recorded before the device call, "
    "so a launch the device refused leaves an event for a step that never ran",
    "logprob-fence-ids-only": "readback_issue (tt): the logprob ring is copied after the ids' "
    "event under an event of its own, and the slot's rewrite fence covers the ids only, so "
    "after a readback the host gave up on, the next launch writes what the copy still reads",
}
"""Bugs of the fault handling (spec rule 12): the lockstep drives no faults, so the fault half
(`conformance/fault_runs.py`: serving runs that meet one device fault each) kills these;
`ttmirror mutants` lists them beside the lockstep's, `by: faults`."""

TT_ONLY = frozenset(
    {
        "host-read-before-event", "readback-cq1-no-wait", "ring-reuse-k1", "stage-cq1-no-event",
        "where-swapped", "mask-inverted", "gather-off-by-one", "gather-current-slot",
        "positions-stale", "sampler-keyed-by-row", "sampler-keyed-by-step",
    }
)
"""Bugs of the tt mirror's device half (its queues, events and ops): the cpu backend has none."""

SPEC_BUGS = frozenset(
    {
        "positions-advance-by-spec", "bonus-token-dropped", "rejected-draft-delivered",
        "reentering-drafts-from-device", "host-drafts-placeholder", "count-from-wrong-row",
        "draft-part-previous-slot",
    }
)
"""Bugs of speculative decoding (spec rule 13): they exist only where rows carry drafts, so the
kill matrix runs them at a bound with spec tokens; planted in the tt and the cpu mirror."""

SUBSETS_BUGS = frozenset({"draft-count-of-another-row", "skipped-from-previous-step"})
"""Bugs of vLLM's scheduler freedoms (spec rule 14): they exist only where a step may leave a
request out or a row carry fewer drafts than another, so the kill matrix runs them with
subsets."""

ROWS_BUGS = frozenset({"state-row-reused-in-flight", "idx-from-previous-order"})
"""Bugs of per-request state rows (spec rule 14): they exist only where the device keeps a
state row per request, so the kill matrix runs them with state rows."""

ALL: dict[str, str] = {**BUGS, **SERVING_BUGS, **FAULT_HANDLING_BUGS}
"""Every planted bug, by id."""


def check(ids: Iterable[str | None] = ()) -> frozenset[str]:
    """The set of `ids` (None entries ignored), or ValueError naming an unknown one."""
    chosen = frozenset(i for i in ids if i is not None)
    unknown = sorted(chosen - set(ALL))
    if unknown:
        raise ValueError(f"unknown planted bug {unknown[0]!r}; choose one of: {', '.join(ALL)}")
    return chosen


BUG_VARIABLE = "TTMIRROR_BUG"
"""The environment's way to plant a bug in `fuzz` and `replay` (and `make fuzz-long`): the
command line and the fuzz target read it and pass the bug on as a value; nothing else reads it."""


def planted_bug(given: str | None = None) -> str | None:
    """The bug to plant in the lockstep: `given` (an option), else $TTMIRROR_BUG, else None;
    ValueError, naming the choices, for one that is not a planted bug of the lockstep."""
    bug = given if given is not None else (os.environ.get(BUG_VARIABLE) or None)
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; choose from: {', '.join(BUGS)}")
    return bug


def model_only(release_at: str, variant: str) -> tuple[str, str] | None:
    """A model-only option the implementation has no switch for (`--release-at issue`, a
    `--variant`) and the planted bug that stands for it; None for options it runs."""
    if release_at != "complete":
        return "--release-at issue", "release-at-issue"
    return (f"--variant {variant}", variant) if variant else None

"""The probe's drafter and verification (spec rule 13): lossless against plain decoding, greedy
and seeded, with acceptance that really varies."""

from __future__ import annotations

from collections import Counter

import pytest

from ttmirror.impl.drafts import DraftReference, DraftSpec, agreeing_rows, draft_table
from ttmirror.impl.probe import ProbeReference, ProbeSpec

GREEDY, SEEDED = ProbeSpec(), ProbeSpec(sampling=7)


@pytest.mark.parametrize("probe", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 2])
def test_decoding_with_drafts_gives_plain_decodings_tokens(probe: ProbeSpec, k: int) -> None:
    plain = ProbeReference(probe)
    ref = DraftReference(probe, DraftSpec(k=k))
    counts: Counter[int] = Counter()
    for request, prompt in enumerate(range(0, 64, 5)):
        tokens, accepted = ref.sequence(prompt, 40, request)
        assert tokens == plain.sequence(prompt, 40, request)
        counts.update(accepted)
    # Every accepted count occurred, so the comparison covered rejections and full accepts.
    assert set(counts) == set(range(k + 1)), counts


def test_a_rejected_draft_is_never_yielded() -> None:
    ref = DraftReference(GREEDY, DraftSpec(k=2))
    plain = ProbeReference(GREEDY)
    seen_rejection = False
    for newest in range(GREEDY.vocab):
        drafts = ref.propose(newest, 3)
        run = ref.verify(newest, 3, drafts)
        assert 1 <= len(run) <= 3
        assert run[0] == plain.next_token(newest, 3)
        a = len(run) - 1
        assert run[:a] == drafts[:a]  # the accepted drafts, then the target's own token
        if a < 2:
            seen_rejection = True
            assert run[a] != drafts[a]  # the rejected draft's position holds the target's
    assert seen_rejection


def test_the_draft_table_is_the_drafter() -> None:
    spec = DraftSpec(k=1, agreement=0.5)
    ref = DraftReference(GREEDY, spec)
    table = draft_table(GREEDY, spec)
    for token in range(GREEDY.vocab):
        for pos in (0, 7, 100):
            assert int(table[token + pos].argmax()) == ref.draft(token, pos)
    share = float(agreeing_rows(GREEDY, spec).float().mean())
    assert 0.4 < share < 0.6


def test_bad_draft_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="must be 1 or 2"):
        DraftSpec(k=3)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        DraftSpec(agreement=1.5)

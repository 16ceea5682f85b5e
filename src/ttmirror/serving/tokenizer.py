"""A character-level tokenizer for the probe and the tiny models, written into a model directory.

vLLM's server takes and returns text only through a tokenizer in the model's directory; without
one it must run with `--skip-tokenizer-init` (token ids in and out). The models here are tiny
(vocabularies of 64 and 256 ids), so the tokenizer maps every id to one character: id 0 is the
end-of-text token (the models' `eos_token_id`, a stop of every request that does not
`ignore_eos`), id 1 the unknown character, and the rest an alphabet that fits the vocabulary:

- 64 ids (the probe): lowercase letters, digits, space, newline and 24 punctuation marks, with
  the input lowercased first;
- 99 ids or more (the tiny models: 256): printable ASCII, newline and tab; the ids beyond are
  Latin-1 letters and symbols, so every id the model may sample decodes to a character of its own.

It is built with Hugging Face's `tokenizers` (a `WordLevel` model over single characters) and
saved as a `PreTrainedTokenizerFast`, with a chat template, so vLLM's `/v1/chat/completions`
renders messages too.
"""

from __future__ import annotations

import string

EOS = "<|endoftext|>"
UNK = "<unk>"
SPECIALS = (EOS, UNK)
"""Ids 0 and 1."""
EOS_ID = 0
SMALL_ALPHABET = (" \n" + string.ascii_lowercase + string.digits + ".,!?'\"-:;()/_=+*#{}%<>[]")
"""The 62 characters of a 64-id vocabulary (its input is lowercased)."""
ASCII_ALPHABET = string.printable[:95] + "\n\t"
"""Printable ASCII (space included), newline and tab: 97 characters."""
EXTRA_START = 0xA1
"""Ids past the ASCII alphabet decode to the characters from U+00A1 on (never whitespace)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
"""One line per message, `role: content`, then the assistant's turn: characters of either
alphabet (the small one's lowercased input included)."""

assert len(SMALL_ALPHABET) == 62 and len(set(SMALL_ALPHABET)) == 62
assert len(set(ASCII_ALPHABET)) == 97


def alphabet(vocab: int) -> tuple[str, bool]:
    """The characters of ids 2..vocab-1, and whether input is lowercased first; ValueError (one
    line) for a vocabulary too small to hold the small alphabet."""
    room = vocab - len(SPECIALS)
    if room == len(SMALL_ALPHABET):
        return SMALL_ALPHABET, True
    if room < len(ASCII_ALPHABET):
        raise ValueError(f"a character tokenizer needs a vocabulary of 64 or at least "
                         f"{len(SPECIALS) + len(ASCII_ALPHABET)} ids, not {vocab}")
    extra = "".join(chr(EXTRA_START + i) for i in range(room - len(ASCII_ALPHABET)))
    return ASCII_ALPHABET + extra, False


def build_tokenizer(vocab: int, max_context: int) -> object:
    """A `transformers.PreTrainedTokenizerFast` of exactly `vocab` ids (see the module)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars, lower = alphabet(vocab)
    ids = {token: i for i, token in enumerate((*SPECIALS, *chars))}
    assert len(ids) == vocab
    core = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    if lower:
        core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters back to back: no spaces put between them
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, unk_token=UNK,
        model_max_length=max_context, chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False)


def write_tokenizer(path: str, vocab: int, max_context: int) -> None:
    """Save the tokenizer of a `vocab`-id model into the model directory `path`."""
    tokenizer = build_tokenizer(vocab, max_context)
    tokenizer.save_pretrained(path)  # type: ignore[attr-defined]

"""`vllm serve` on the TT mirror, asked as people ask it: vLLM's OpenAI-compatible server (its
API process and its engine-core process) on localhost, a real HTTP client, vLLM's default
sampling (temperature 1.0, no seed), text in and out through the model directory's tokenizer,
chat, n > 1, stop strings, logprobs, biases and masks, prefix caching, structured outputs and
drafts, token-id prompts, and load from vLLM's own client (`vllm
bench serve`). A parameter the mirror does not serve is
refused with HTTP 400 naming it while a concurrent request completes; a request the mirror
refuses at run time fails alone with its reason and the server goes on. Ctrl-C shuts it down,
no process is left, and the worker's events validate, refusals and drawn seeds included."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ttmirror.conformance.traces.validate import bounds_of, validate
from ttmirror.impl.probe import ProbeReference
from ttmirror.serving.models import ProbeDecoder, load_model_dir, write_model_dir
from ttmirror.vllm_serve import Server

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def _probe(tmp_path: Path) -> tuple[str, ProbeDecoder]:
    model_dir = str(tmp_path / "model")
    write_model_dir("probe", model_dir)
    model = load_model_dir(model_dir)
    assert isinstance(model, ProbeDecoder)
    return model_dir, model


def model_tokenizer_id(model_dir: str, text: str) -> int:
    """The one id the model directory's tokenizer gives `text`."""
    from transformers import AutoTokenizer

    (token,) = AutoTokenizer.from_pretrained(model_dir).encode(text)
    return int(token)


def test_vllm_serve_answers_requests_as_people_send_them(tmp_path: Path) -> None:
    model_dir, model = _probe(tmp_path)
    # vLLM's own defaults but for the sizes: async scheduling on, its seed 0, max_logprobs 20
    # raised to 100 so that vLLM admits a request for more logprobs than the mirror's ring
    # holds (the probe's vocabulary, 64): the mirror refuses that one at run time.
    server = Server(model_dir, tmp_path / "events.itf.json", "--async-scheduling",
                    "--max-model-len", "128", "--max-num-seqs", "4", "--max-logprobs", "100",
                    "--enable-prompt-tokens-details")
    unseeded = 0
    try:
        # Only model, prompt (text) and max_tokens: vLLM samples at temperature 1.0, no seed.
        status, answer = server.post(COMPLETIONS, {"prompt": "hello world", "max_tokens": 8})
        unseeded += 1
        assert status == 200, answer
        (choice,) = answer["choices"]
        assert isinstance(choice["text"], str) and choice["finish_reason"] in ("length", "stop")
        assert 1 <= answer["usage"]["completion_tokens"] <= 8

        # Twenty at once, each with default sampling: every one answered.
        with ThreadPoolExecutor(8) as pool:
            many = list(pool.map(lambda i: server.post(
                COMPLETIONS, {"prompt": f"request {i}", "max_tokens": 12}), range(20)))
        unseeded += 20
        assert [s for s, _ in many] == [200] * 20, [a for s, a in many if s != 200]

        # Token ids in and out, greedy: the probe's own continuation.
        for prompt in ([1, 2, 3], [9, 4], [30]):
            status, answer = server.post(COMPLETIONS, {
                "prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
                "ignore_eos": True})
            assert status == 200, answer
            (choice,) = answer["choices"]
            assert choice["finish_reason"] == "length"
            assert choice["token_ids"] == ProbeReference(model.spec).sequence(prompt[-1], 6)

        # A parameter the mirror does not serve: 400 naming it, while a greedy request sent
        # just before it completes.
        with ThreadPoolExecutor(2) as pool:
            greedy = pool.submit(server.post, COMPLETIONS, {
                "prompt": "a long greedy request", "max_tokens": 48, "temperature": 0,
                "ignore_eos": True})
            refused = pool.submit(server.post, COMPLETIONS, {
                "prompt": "hello", "max_tokens": 8, "prompt_logprobs": 1})
            status, answer = refused.result()
            assert status == 400, answer
            assert "prompt_logprobs" in answer["error"]["message"], answer
            assert answer["error"]["param"] == "prompt_logprobs"
            status, answer = greedy.result()
            assert status == 200 and answer["usage"]["completion_tokens"] == 48, answer

        # vLLM admits 80 logprobs (its limit is 100 here); the mirror's ring holds 64: that
        # request fails alone with the mirror's reason, and the next one is served.
        status, answer = server.post(COMPLETIONS, {"prompt": "hi", "max_tokens": 4,
                                                   "logprobs": 80})
        unseeded += 1
        assert status == 500, answer
        assert "logprobs=80" in answer["error"]["message"], answer
        assert server.healthy()
        status, answer = server.post(COMPLETIONS, {"prompt": "hi", "max_tokens": 4,
                                                   "logprobs": 2})
        unseeded += 1
        assert status == 200, answer
        lp = answer["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == answer["usage"]["completion_tokens"] == len(lp["top_logprobs"])
        assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"])

        # Biases and masks, on the device: logit_bias, allowed_token_ids, bad_words, min_p.
        def ids(extra: dict[str, object]) -> list[int]:
            status, answer = server.post(COMPLETIONS, {
                "prompt": "masks", "max_tokens": 12, "ignore_eos": True,
                "return_token_ids": True, **extra})
            assert status == 200, answer
            token_ids: list[int] = answer["choices"][0]["token_ids"]
            assert len(token_ids) == 12
            return token_ids

        assert set(ids({"logit_bias": {"17": 100}})) == {17}
        assert set(ids({"allowed_token_ids": list(range(10, 16))})) <= set(range(10, 16))
        e = model_tokenizer_id(model_dir, "e")
        assert e in ids({"temperature": 0, "logit_bias": {str(e): 100}})  # "e" would come...
        assert e not in ids({"temperature": 0, "logit_bias": {str(e): 100},
                             "bad_words": ["e"]})  # ...and a bad word keeps it out
        # The probe's most likely id is 7.4 times as likely as any other: min_p 0.5 leaves
        # only it, so sampling gives the greedy tokens.
        assert ids({"min_p": 0.5}) == ids({"temperature": 0})
        unseeded += 3  # the logit_bias, allowed_token_ids and min_p requests sample

        # n = 2: vLLM fans out two requests, each drawing its own seed.
        status, answer = server.post(COMPLETIONS, {"prompt": "two", "max_tokens": 10, "n": 2,
                                                   "ignore_eos": True})
        unseeded += 2
        assert status == 200 and len(answer["choices"]) == 2, answer
        assert answer["choices"][0]["text"] != answer["choices"][1]["text"]

        # A request's own seed: the same text twice.
        seeded = [server.post(COMPLETIONS, {"prompt": "seeded", "max_tokens": 10, "seed": 7,
                                            "ignore_eos": True})[1]["choices"][0]["text"]
                  for _ in range(2)]
        assert seeded[0] == seeded[1]

        # A stop string cuts the text before it (vLLM's detokenizer, through the tokenizer).
        body = {"prompt": "stop here", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        full = server.post(COMPLETIONS, body)[1]["choices"][0]["text"]
        assert len(full) > 5  # the special ids (end of text, unknown) are not text
        stop = full[5]
        status, answer = server.post(COMPLETIONS, {**body, "stop": [stop]})
        (choice,) = answer["choices"]
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (
            full[:full.index(stop)], "stop", stop)

        # Prefix caching (vLLM's default): the same long prompt again finds its first blocks
        # cached, computes only the rest, and gives the same greedy text.
        body = {"prompt": "a prompt long enough to fill two blocks of sixteen tokens",
                "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        first, again = (server.post(COMPLETIONS, body)[1] for _ in range(2))
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32, again["usage"]
        assert again["choices"][0]["text"] == first["choices"][0]["text"]

        # Chat: the model directory's template renders the messages.
        status, answer = server.post(CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 8})
        unseeded += 1
        assert status == 200, answer
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert isinstance(answer["choices"][0]["message"]["content"], str)
        assert answer["usage"]["prompt_tokens"] == len("user: hi\nassistant: ")
        # Structured output (vLLM's grammar bitmask, on the device): a JSON object.
        status, answer = server.post(CHAT, {"messages": [{"role": "user", "content": "json"}],
                                            "max_tokens": 24, "temperature": 0,
                                            "response_format": {"type": "json_object"}})
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"].lstrip().startswith("{"), answer

        # Load from vLLM's own client: `vllm bench serve`, random prompts, its defaults
        # (temperature from the server: 1.0), four at a time: every request completes.
        prompts = 24
        result = server.bench(tmp_path / "bench.json", "--dataset-name", "random",
                              "--num-prompts", str(prompts), "--random-input-len", "16",
                              "--random-output-len", "24", "--max-concurrency", "4",
                              "--seed", "0")
        unseeded += prompts
        assert (result["completed"], result.get("failed", 0)) == (prompts, 0), result
        assert result["total_output_tokens"] == prompts * 24  # vLLM's random set ignores eos
    finally:
        events = server.stop()
    d = validate(events, bounds_of(events))
    assert d is None, d.line()
    # Every sampled request without a seed drew one from the engine's stream, recorded.
    seeds = [e.get("seed") for e in events if e.action == "arrive" and e.get("seed") is not None]
    assert len(seeds) == unseeded - 1  # the refused one never arrived
    refusals = [e for e in events if e.action == "refuse"]
    assert len(refusals) == 1 and "logprobs=80" in refusals[0].get("reason")


def test_vllm_serve_with_drafts(tmp_path: Path) -> None:
    """Drafts (K = 2, the probe's own drafter on the device) under vLLM's async scheduling:
    - structured outputs: vLLM's grammar bitmask masks every query token of a constrained row
      on the device (its next token and the token after each draft), so with drafts accepted
      the text still matches the regex (a lane left unmasked would draw outside it, and vLLM's
      grammar would end the request with an error);
    - logprobs: one entry per generated token, rows that accepted drafts included;
    - near max_model_len vLLM trims a row's drafts (spec rule 14): the row carries what vLLM
      scheduled, the request runs to the limit (finish reason "length"), and the next request
      is served."""
    model_dir, _ = _probe(tmp_path)
    server = Server(model_dir, tmp_path / "events.itf.json", "--async-scheduling",
                    "--max-model-len", "128", "--max-num-seqs", "4", "--speculative-config",
                    f'{{"method": "draft_model", "model": "{model_dir}", '
                    '"num_speculative_tokens": 2}')
    try:
        for regex, pattern in ((r"[a-z]{24}", r"[a-z]{24}"), (r"(ab|cd){5}z", r"(ab|cd){5}z"),
                               (r"[0-9]{20}", r"[0-9]{20}")):
            for temperature in (0.0, 1.0):
                status, answer = server.post(COMPLETIONS, {
                    "prompt": "answer:", "max_tokens": 40, "temperature": temperature,
                    "structured_outputs": {"regex": regex}})
                assert status == 200, answer
                (choice,) = answer["choices"]
                assert re.fullmatch(pattern, choice["text"]), (regex, choice["text"])
                assert choice["finish_reason"] == "stop"

        status, answer = server.post(COMPLETIONS, {"prompt": "logprobs", "max_tokens": 24,
                                                   "temperature": 0, "logprobs": 2,
                                                   "ignore_eos": True})
        assert status == 200, answer
        lp = answer["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(lp["top_logprobs"]) == 24
        for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
            assert max(top, key=top.get) == token  # greedy: the most likely one

        status, answer = server.post(COMPLETIONS, {"prompt": "x" * 100, "max_tokens": 28,
                                                   "temperature": 0, "ignore_eos": True})
        assert status == 200, answer
        (choice,) = answer["choices"]
        assert choice["finish_reason"] == "length"
        assert answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"] == 128
        assert server.healthy()
        status, answer = server.post(COMPLETIONS, {"prompt": "ab", "max_tokens": 3,
                                                   "temperature": 0, "ignore_eos": True})
        assert status == 200 and answer["usage"]["completion_tokens"] == 3, answer
    finally:
        events = server.stop()
    d = validate(events, bounds_of(events))
    assert d is None, d.line()
    # Nothing was refused: vLLM ended the constrained requests when their grammar completed.
    assert not [e for e in events if e.action in ("abort", "refuse") and e.get("reason")]
    stats, decided = server.summary["stats"], server.summary["vllm"]
    # Near the limit rows carried fewer drafts than they had, as vLLM scheduled them.
    assert stats.get("fewer_drafts", 0) > 0 and decided["fewer_drafts"] > 0, (stats, decided)
    # Drafts were accepted, on constrained rows too: masked rows in steps with drafts.
    assert decided["masked_rows"] > 0 and stats.get("accepted_1", 0) > 0, (decided, stats)
    assert stats.get("accepted_2", 0) > 0, stats

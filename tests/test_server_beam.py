"""Beam search through a real `python -m server` and the openai SDK, as vLLM's clients send it
(``extra_body={"use_beam_search": True}`` with ``n`` beams).

The engine's search itself is checked against reference searches in test_beam_search.py;
here: the response's shape (n choices, indexes 0..n-1, sorted by score, usage as vLLM
counts it), that it equals the offline engine's search, that it is deterministic on
completions and chat, and that a beam request does not stall ordinary streams next to it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from server_helpers import default_tokenizer, offline_llm

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The three primary colors are"
BEAMS = {"use_beam_search": True}


@pytest.fixture(scope="module")
def client(plain_server):
    from openai import OpenAI

    with OpenAI(base_url=plain_server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def test_completions_beams_sorted_deterministic_and_equal_to_offline(client) -> None:
    from actors import SamplingParams

    def ask():
        return client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8,
                                         temperature=0.0, logprobs=1, extra_body=BEAMS)

    first, second = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2]
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in second.choices]
    assert len(set(texts)) == 3
    ids = default_tokenizer().encode(PROMPT, add_special_tokens=False)
    want = offline_llm().generate([ids], SamplingParams(n=3, use_beam_search=True,
                                                        max_tokens=8))[0]
    assert texts == [o.text for o in want.outputs]
    assert [c.finish_reason for c in first.choices] == [o.finish_reason for o in want.outputs]
    # usage as vLLM counts it: the prompt once, every returned beam's tokens
    lengths = [len(c.logprobs.tokens) for c in first.choices]
    assert lengths == [len(o.token_ids) for o in want.outputs]
    assert first.usage.prompt_tokens == len(ids)
    assert first.usage.completion_tokens == sum(lengths)
    # sorted best first: a beam that ran to max_tokens scores its mean logprob
    scores = [sum(c.logprobs.token_logprobs) / max(len(c.logprobs.tokens), 1)
              for c, o in zip(first.choices, want.outputs) if o.finish_reason == "length"]
    assert scores == sorted(scores, reverse=True)


def test_chat_beams_are_n_sorted_choices_and_deterministic(client) -> None:
    messages = [{"role": "user", "content": "Name a fruit."}]

    def ask(**kw):
        return client.chat.completions.create(
            model=MODEL, messages=messages, n=3, max_tokens=10, logprobs=True,
            extra_body={**BEAMS, "ignore_eos": True, "length_penalty": 0.5}, **kw)

    first, second = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2]
    contents = [c.message.content for c in first.choices]
    assert contents == [c.message.content for c in second.choices]
    assert len(set(contents)) == 3
    assert all(c.finish_reason == "length" for c in first.choices)
    sums = [sum(t.logprob for t in c.logprobs.content) for c in first.choices]
    assert sums == sorted(sums, reverse=True)  # equal lengths: the score's order
    assert first.usage.completion_tokens == 30
    # the same search streams as one delta per choice (vLLM streams it too)
    streamed = [""] * 3
    for chunk in ask(stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == contents


def test_a_beam_search_does_not_stall_streams_next_to_it(client) -> None:
    def stream(i: int) -> int:
        got = client.completions.create(
            model=MODEL, prompt=f"Story number {i}:", max_tokens=48, stream=True,
            temperature=1.0, seed=i, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True})
        return [c for c in got if c.usage is not None][-1].usage.completion_tokens

    def beams() -> int:
        got = client.completions.create(model=MODEL, prompt=PROMPT, n=4, max_tokens=32,
                                        extra_body={**BEAMS, "ignore_eos": True})
        return len(got.choices)

    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream, i) for i in range(3)]
        search = pool.submit(beams)
        assert [s.result(timeout=300) for s in streams] == [48, 48, 48]
        assert search.result(timeout=300) == 4


@pytest.mark.parametrize("extra, field", [
    ({"logprobs": 2, "logprob_token_ids": [5, 6]}, "logprob_token_ids"),
    ({"repetition_detection": {"max_pattern_size": 4, "min_count": 3}}, "repetition_detection"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_fields_a_beam_cannot_honour_are_refused_not_dropped(plain_server, extra, field) -> None:
    import httpx

    body = {"model": MODEL, "prompt": PROMPT, "n": 2, "max_tokens": 4, **BEAMS, **extra}
    r = httpx.post(plain_server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"], err


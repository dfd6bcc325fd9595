"""Stop strings in the offline LLM: the detokenizer the server uses ends a choice at its
stop string, the core aborts that choice alone, and the answer (text, finish reason, stop
reason) is the one `python -m server` gives for the same prompt."""

from __future__ import annotations

import re

import httpx
import pytest

from actors import SamplingParams
from server_helpers import offline_llm

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def llm():
    return offline_llm()


@pytest.fixture(scope="module")
def prompt_ids(llm) -> list[int]:
    return llm.tokenizer.encode(PROMPT, add_special_tokens=False)


@pytest.fixture(scope="module")
def full(llm, prompt_ids):
    """The greedy continuation without stop strings."""
    out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=24))[0]
    return out.outputs[0]


@pytest.fixture(scope="module")
def word(full) -> str:
    """The stop string of these tests: a word that the greedy continuation holds once, a
    quarter of the way in. The continuation is read, not assumed: bf16 kernels of
    different CPUs (AVX2, AVX512_BF16) round differently, and greedy text follows."""
    for m in re.finditer(r"[A-Za-z]{4,}", full.text):
        if m.start() > len(full.text) // 4 and full.text.count(m.group()) == 1:
            return m.group()
    pytest.fail(f"no stop word in the greedy continuation {full.text!r}")


def test_stop_string_ends_the_choice_before_it(llm, prompt_ids, full, word) -> None:
    co = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=24,
                                                   stop=[word]))[0].outputs[0]
    assert co.text == full.text[: full.text.index(word)]
    assert co.finish_reason == "stop" and co.stop_reason == word
    # Generation ended at the token completing the word: a strict prefix of the full run.
    assert 0 < len(co.token_ids) < len(full.token_ids)
    assert co.token_ids == full.token_ids[: len(co.token_ids)]
    assert word in llm.tokenizer.decode(co.token_ids)
    assert word not in llm.tokenizer.decode(co.token_ids[:-1])
    assert not llm.engine.has_unfinished()
    assert llm.engine.stats().kv_usage == 0.0


def test_include_stop_str_in_output(llm, prompt_ids, full, word) -> None:
    co = llm.generate([prompt_ids], SamplingParams(
        temperature=0, max_tokens=24, stop=["no such text", word],
        include_stop_str_in_output=True))[0].outputs[0]
    assert co.text == full.text[: full.text.index(word) + len(word)]
    assert co.finish_reason == "stop" and co.stop_reason == word


def test_unmatched_stop_string_runs_to_length(llm, prompt_ids, full) -> None:
    co = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=24,
                                                   stop=["no such text"]))[0].outputs[0]
    assert (co.text, co.token_ids) == (full.text, full.token_ids)
    assert co.finish_reason == "length" and co.stop_reason is None


def test_seeded_choices_stop_each_at_their_own_string(llm, prompt_ids) -> None:
    base = dict(n=6, seed=11, temperature=1.0, max_tokens=24)
    free = llm.generate([prompt_ids], SamplingParams(**base))[0].outputs
    stops = [",", "."]
    got = llm.generate([prompt_ids], SamplingParams(**base, stop=stops))[0].outputs
    stopped = 0  # choices that stopped before their 24th token (aborted in the core)
    for f, g in zip(free, got):
        hits = [(f.text.find(s), s) for s in stops if s in f.text]
        if not hits:
            assert (g.text, g.token_ids, g.finish_reason) == (f.text, f.token_ids, "length")
            continue
        pos, s = min(hits)
        assert g.text == f.text[:pos] and g.finish_reason == "stop" and g.stop_reason == s
        # An aborted choice leaves its siblings' tokens untouched.
        assert g.token_ids == f.token_ids[: len(g.token_ids)]
        stopped += len(g.token_ids) < len(f.token_ids)
    assert stopped >= 2, [f.text for f in free]
    assert len({f.text for f in free}) > 1
    assert not llm.engine.has_unfinished()
    assert llm.engine.stats().kv_usage == 0.0


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server.url


@pytest.mark.parametrize("include", [False, True])
def test_same_answer_as_the_server(server, llm, prompt_ids, word, include) -> None:
    want = llm.generate([prompt_ids], SamplingParams(
        temperature=0, max_tokens=24, stop=[word],
        include_stop_str_in_output=include))[0].outputs[0]
    r = httpx.post(server + "/v1/completions", timeout=60, json={
        "prompt": prompt_ids, "max_tokens": 24, "temperature": 0, "stop": [word],
        "include_stop_str_in_output": include})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (want.text, "stop")
    assert choice["stop_reason"] == word == want.stop_reason
    assert r.json()["usage"]["completion_tokens"] == len(want.token_ids)


# -- a choice ended by a token: its text is not output (vLLM's rule) ------------------------

def _stop_token_case(llm, prompt_ids, full) -> tuple[int, str]:
    """A plain-word token of the greedy run to stop on, and the text before it."""
    stop_id = full.token_ids[3]
    before = llm.tokenizer.decode(full.token_ids[:3])
    return stop_id, before


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_id_text_is_left_out(server, llm, prompt_ids, full, include) -> None:
    stop_id, before = _stop_token_case(llm, prompt_ids, full)
    params = dict(temperature=0, max_tokens=24, stop_token_ids=[stop_id],
                  include_stop_str_in_output=include)
    co = llm.generate([prompt_ids], SamplingParams(**params))[0].outputs[0]
    assert co.token_ids == full.token_ids[:4] and co.stop_reason == stop_id
    word = llm.tokenizer.decode(full.token_ids[:4])
    assert co.text == (word if include else before)
    r = httpx.post(server + "/v1/completions", timeout=60,
                   json={"prompt": prompt_ids, **params})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["stop_reason"]) == (co.text, stop_id)


def test_eos_text_is_left_out_when_special_tokens_are_kept(server, llm) -> None:
    """With skip_special_tokens false the end token's text (<|im_end|>) is not the end of
    every answer, as in vLLM; include_stop_str_in_output keeps it."""
    messages = [{"role": "user", "content": "Say hi."}]
    text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    eos = llm.tokenizer.decode([llm.engine.info.eos_token_ids[0]])
    for include in (False, True):
        co = llm.generate([ids], SamplingParams(
            temperature=0, max_tokens=64, skip_special_tokens=False,
            include_stop_str_in_output=include))[0].outputs[0]
        assert co.finish_reason == "stop" and co.token_ids[-1] in llm.engine.info.eos_token_ids
        assert co.text.endswith(eos) == include, co.text
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "messages": messages, "max_tokens": 64, "temperature": 0,
        "skip_special_tokens": False})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert eos not in choice["message"]["content"], choice

"""n > 1 on a real `python -m server`: one engine request per prompt, forked by the engine.

The engine runs a prompt once and forks its other n - 1 choices after the first token
(sharing the prompt's KV blocks), so a served request with n choices must (a) enter the
engine once, visible in /metrics as one prompt's worth of prompt tokens and prefix-cache
lookups, and (b) give the choices the offline engine (actors.LLM) gives the same prompt with
the same seed, since both run the same fork with the same per-choice seeds.
"""

from __future__ import annotations

import httpx
import pytest

from server_helpers import metric, offline_llm

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total",
            "vllm:generation_tokens_total")


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server.url


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {name: metric(text, name, model_name=MODEL) for name in COUNTERS}
    out["computed"] = metric(text, "vllm:prompt_tokens_by_source_total", model_name=MODEL,
                             source="local_compute")
    assert all(v is not None for v in out.values()), out
    return out  # type: ignore[return-value]


def test_n16_prefills_once_and_matches_offline(server):
    from actors import SamplingParams

    r = httpx.post(server + "/tokenize", json={"prompt": "The old lighthouse keeper",
                                               "add_special_tokens": False})
    ids = r.json()["tokens"]
    assert 1 < len(ids) < 16, ids  # one partial block: no prefix-cache hit can blur counts
    before = counters(server)
    r = httpx.post(server + "/v1/completions", timeout=120, json={
        "prompt": ids, "n": 16, "seed": 7, "temperature": 1, "max_tokens": 8,
        "ignore_eos": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    after = counters(server)
    delta = {k: after[k] - before[k] for k in after}
    # (a) One prompt entered the engine, not 16: its tokens counted once, one lookup.
    assert delta["vllm:prompt_tokens_total"] == len(ids), delta
    assert delta["computed"] == len(ids), delta
    assert delta["vllm:prefix_cache_queries_total"] == len(ids) - 1, delta
    assert delta["vllm:generation_tokens_total"] == 16 * 8, delta
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 16 * 8,
                             "total_tokens": len(ids) + 16 * 8, "prompt_tokens_details": None}

    # (b) The choices the offline engine makes from the same ids, seed and n.
    want = offline_llm().generate([ids], SamplingParams(n=16, seed=7, temperature=1.0,
                                                        max_tokens=8, ignore_eos=True,
                                                        logprobs=0))[0].outputs
    tok = offline_llm().tokenizer.backend_tokenizer
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == list(range(16))
    for got, exp in zip(choices, want):
        assert got["text"] == exp.text, (got["index"], got["text"], exp.text)
        # Token by token (the text of each sampled token, as logprobs prints it).
        assert got["logprobs"]["tokens"] == [
            tok.decode([t], skip_special_tokens=False) for t in exp.token_ids]
        assert got["logprobs"]["token_logprobs"] == pytest.approx(
            [lp.logprob for lp in exp.logprobs], abs=1e-3)
    # Seeded choices differ from each other (they are not one choice repeated).
    assert len({c["text"] for c in choices}) > 1


def test_stop_string_ends_one_choice_only(server):
    """A stop string matched in one choice aborts that choice alone in the engine: the
    other choices of the same prompt run to their own ends."""
    r = httpx.post(server + "/v1/completions", timeout=120, json={
        "prompt": "Count: one two three", "n": 8, "seed": 11, "temperature": 1,
        "max_tokens": 24, "ignore_eos": True, "stop": [" the"]})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    reasons = {c["finish_reason"] for c in choices}
    for c in choices:
        assert " the" not in c["text"]
    assert reasons <= {"stop", "length"}
    stopped = [c for c in choices if c["finish_reason"] == "stop"]
    long = [c for c in choices if c["finish_reason"] == "length"]
    # Seeds 11: some choices say " the" early, others never do within 24 tokens.
    assert stopped and long, reasons
    text = httpx.get(server + "/metrics").text
    assert metric(text, "vllm:num_requests_running", model_name=MODEL) == 0

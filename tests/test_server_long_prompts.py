"""Prompts longer than --max-num-batched-tokens on a real `python -m server`.

A 3,000- and a 6,000-token prompt (the server's context is 8,192) take several chunked steps,
the first ones carrying only mid-prompt chunks (no row samples). Alone (both) and while 16
streams decode beside it (the 3,000-token one), the greedy output equals the offline engine's
on the same prompt computed in one unchunked step.
"""

from __future__ import annotations

import threading
import time
import httpx
import orjson
import pytest

from server_helpers import ServerProcess, default_tokenizer, metric

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CONTEXT = 8192
NEW_TOKENS = 16
STREAMS = 16
STREAM_TOKENS = 64
# Prefix caching off: the same long prompt, sent again, must be computed again in chunks.
ARGS = ("--max-model-len", str(CONTEXT), "--kv-cache-memory", "512m",
        "--no-enable-prefix-caching")
# A passage the model continues by copying, so that the margins between its top tokens are
# wide: the rounding of rows computed in different chunks cannot flip a near-tie.
PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting each "
    "of the one hundred and twelve steps, trimming the wick and polishing the great lens "
    "until it shone. Ships passing the rocky point relied on its beam through fog and storm. "
)


def long_prompt(num_tokens: int) -> list[int]:
    unit = default_tokenizer()(PASSAGE, add_special_tokens=False)["input_ids"]
    return (unit * (num_tokens // len(unit) + 1))[:num_tokens]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(*ARGS).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


class Offline:
    """The offline engine with the server's settings, computing each prompt in one step;
    each prompt's greedy text is computed once for the module (an 8,000-token prompt's
    attention is most of a test's time on a small CPU)."""

    def __init__(self) -> None:
        from actors import LLM

        self.llm = LLM(max_model_len=CONTEXT, kv_cache_memory=256 << 20,
                       max_num_batched_tokens=CONTEXT, enable_prefix_caching=False)
        self.texts: dict[int, str] = {}

    def greedy(self, num_tokens: int) -> str:
        if num_tokens not in self.texts:
            from actors import SamplingParams

            params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
            out = self.llm.generate([long_prompt(num_tokens)], params)[0].outputs[0]
            assert len(out.token_ids) == NEW_TOKENS
            self.texts[num_tokens] = out.text
        return self.texts[num_tokens]


@pytest.fixture(scope="module")
def offline() -> Offline:
    return Offline()


def served(url: str, prompt: list[int]) -> tuple[str, float]:
    """(text, seconds) of a greedy completion."""
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/completions", timeout=600, json={
        "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
    seconds = time.monotonic() - t0
    assert r.status_code == 200, r.text[:500]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert r.json()["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": NEW_TOKENS,
                                 "total_tokens": len(prompt) + NEW_TOKENS,
                                 "prompt_tokens_details": None}
    return choice["text"], seconds


def test_the_kv_cache_holds_the_context_and_the_streams(server):
    text = httpx.get(server.url + "/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    tokens = int(line.split('kv_cache_size_tokens="')[1].split('"')[0])
    # The longest prompt and its output, beside 16 streams of (prompt + output) each.
    assert tokens >= 8000 + NEW_TOKENS + STREAMS * (32 + STREAM_TOKENS)


@pytest.mark.parametrize("num_tokens", [3000, 6000])
def test_long_prompt_alone_matches_the_offline_engine(server, offline: Offline,
                                                      num_tokens: int):
    prompt = long_prompt(num_tokens)
    want = offline.greedy(num_tokens)
    got, seconds = served(server.url, prompt)
    print(f"\n{num_tokens}-token prompt alone: {seconds:.1f} s to serve {NEW_TOKENS} tokens")
    assert got == want


def stream(url: str, prompt: list[int], out: dict, first: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=600) as c, c.stream(
            "POST", "/v1/completions", json={"prompt": prompt, "max_tokens": STREAM_TOKENS,
                                             "ignore_eos": True, "stream": True,
                                             "temperature": 0}) as r:
        out["status"] = r.status_code
        events = []
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            first.set()
        out["events"] = events
        out["end"] = time.monotonic()


# 3,000 tokens take two chunks (the first carries no sampling row) beside the decode rows;
# 6,000 would add only more of the same mid-prompt chunks, at a minute a run here.
@pytest.mark.parametrize("num_tokens", [3000])
def test_long_prompt_beside_16_decoding_streams(server, offline: Offline, num_tokens: int):
    prompt = long_prompt(num_tokens)
    want = offline.greedy(num_tokens)
    outs = [{} for _ in range(STREAMS)]
    firsts = [threading.Event() for _ in range(STREAMS)]
    tok = default_tokenizer()
    threads = [threading.Thread(target=stream, args=(
        server.url, tok(f"Story number {i}: once upon a time", add_special_tokens=False)[
            "input_ids"], outs[i], firsts[i])) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for f in firsts:
        assert f.wait(120)
    running = metric(httpx.get(server.url + "/metrics").text, "vllm:num_requests_running",
                     model_name=MODEL)
    sent_at = time.monotonic()
    got, seconds = served(server.url, prompt)
    for t in threads:
        t.join(600)
    print(f"\n{num_tokens}-token prompt beside {STREAMS} streams: {seconds:.1f} s")
    # Every stream was decoding when the long prompt came, and still was after it was sent:
    # its chunks shared steps with 16 decode rows.
    assert running == STREAMS
    assert got == want
    for out in outs:
        assert out["status"] == 200 and out["events"][-1] == "[DONE]"
        assert out["end"] > sent_at
        chunks = [orjson.loads(e) for e in out["events"][:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

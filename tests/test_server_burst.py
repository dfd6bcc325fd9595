"""Burst admission end to end: 8 streaming requests sent at once to an idle `python -m
server` prefill in one engine step, as the server's own /metrics records it
(llmserve_step_admitted_sequences: one observation per step that admitted sequences).

The server's admission window is widened (a quiet gap of 2 s) so that the burst is one
burst however slowly this machine sends or parses it: what is tested is that requests
being tokenized or arriving within the gap all join the first step, not how fast.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from server_helpers import ServerProcess, metric

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WORDS = ("the harbour light turned slowly over the water while the keeper wrote down every "
         "ship he saw and the weather of each night in a small book").split()


def prompt(i: int) -> str:
    """About 250 tokens, distinct from its first words (no prefix-cache sharing)."""
    return f"Request {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(246))


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--admission-window-ms", "60000", "--admission-quiet-ms",
                        "2000").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


def admitted(url: str) -> tuple[float, float]:
    """(steps that admitted sequences, sequences they admitted) so far."""
    text = httpx.get(url + "/metrics").text
    count = metric(text, "llmserve_step_admitted_sequences_count", model_name=MODEL)
    total = metric(text, "llmserve_step_admitted_sequences_sum", model_name=MODEL)
    return count or 0.0, total or 0.0


async def stream_all(url: str, prompts: list[str]) -> list[str]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                  timeout=300) as client:
        async def one(p: str) -> str:
            text = ""
            stream = await client.completions.create(
                model=MODEL, prompt=p, max_tokens=4, temperature=0, stream=True,
                extra_body={"ignore_eos": True})
            async for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
            return text

        return await asyncio.gather(*(one(p) for p in prompts))


def test_a_burst_of_eight_prefills_in_one_step(server):
    steps, seqs = admitted(server.url)
    texts = asyncio.run(stream_all(server.url, [prompt(i) for i in range(8)]))
    assert all(texts), texts
    after_steps, after_seqs = admitted(server.url)
    # One step admitted all 8 prompts (8 x ~250 tokens fit the 2048-token budget).
    assert (after_steps - steps, after_seqs - seqs) == (1, 8), server.log()
    # The step prefilled every prompt whole: all 8 counted their prompt tokens in it.
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "vllm:prompt_tokens_total", model_name=MODEL) >= 8 * 250


def test_a_lone_request_is_a_step_of_its_own(server):
    steps, seqs = admitted(server.url)
    assert asyncio.run(stream_all(server.url, [prompt(100)]))[0]
    assert admitted(server.url) == (steps + 1, seqs + 1)

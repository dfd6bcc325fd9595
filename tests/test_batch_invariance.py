"""Batch invariance of the default serving mode, black box: a request's tokens and logprobs
do not depend on what else the server runs at the same time.

The shared test server (conftest ``plain_server``) runs the default serving mode: the first
test checks that BASE_ARGS set nothing that changes numerics. 32 prompts of varied
lengths, a third of them behind one long shared prefix (prefix-cache hits, alone and
together), go to the server one at a time and then all at once (32 concurrent streams
through the openai SDK: the token budget of a step then cuts some prompts into chunks,
and decodes share steps with other sequences' prefill chunks). Greedy, then seeded
sampling: texts and logprobs must be identical to the bit.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest
from server_helpers import BASE_ARGS, metric

pytestmark = pytest.mark.slow

NUM_PROMPTS = 32
MAX_TOKENS = 24
WORDS = ["river", "stone", "light", "garden", "paper", "window", "music", "winter", "market", "silver", "forest", "engine", "letter", "morning", "harbor", "thunder", "candle", "orchard", "valley", "lantern", "bridge", "meadow", "copper", "signal", "journey", "shadow", "island", "feather", "castle"]


def _prompts() -> list[str]:
    rng = random.Random(7)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    shared = "Notes from the archive. " + text(260)
    prompts = []
    for i in range(NUM_PROMPTS):
        if i % 3 == 0:  # the shared prefix, then a suffix of its own
            prompts.append(f"{shared} Entry {i}: {text(rng.randint(2, 80))}")
        else:
            prompts.append(f"Story {i}. {text(rng.randint(2, 450))}")
    return prompts


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def server(plain_server: Any) -> str:
    return plain_server.url


def _tokens(url: str, prompt: str) -> int:
    r = httpx.post(url + "/tokenize", json={"prompt": prompt})
    assert r.status_code == 200, r.text
    return len(r.json()["tokens"])


def _params(i: int, seeded: bool) -> dict[str, Any]:
    p: dict[str, Any] = {"max_tokens": MAX_TOKENS, "logprobs": 1,
                         "extra_body": {"ignore_eos": True}}
    if seeded:
        p.update(temperature=1.0, seed=1000 + i)
    else:
        p.update(temperature=0.0)
    return p


def _one_at_a_time(url: str, seeded: bool) -> list[tuple[str, list[Any]]]:
    from openai import OpenAI

    out = []
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        model = c.models.list().data[0].id
        for i, prompt in enumerate(PROMPTS):
            r = c.completions.create(model=model, prompt=prompt, **_params(i, seeded))
            ch = r.choices[0]
            out.append((ch.text, list(zip(ch.logprobs.tokens, ch.logprobs.token_logprobs))))
    return out


def _all_at_once(url: str, seeded: bool) -> list[tuple[str, list[Any]]]:
    """Every prompt as its own stream, all started together."""
    from openai import AsyncOpenAI

    async def one(c: Any, model: str, i: int) -> tuple[str, list[Any]]:
        stream = await c.completions.create(model=model, prompt=PROMPTS[i], stream=True,
                                            **_params(i, seeded))
        text, lps = "", []
        async with stream:
            async for chunk in stream:
                for ch in chunk.choices:
                    text += ch.text
                    if ch.logprobs is not None:
                        lps.extend(zip(ch.logprobs.tokens, ch.logprobs.token_logprobs))
        return text, lps

    async def main() -> list[tuple[str, list[Any]]]:
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=300) as c:
            model = (await c.models.list()).data[0].id
            return list(await asyncio.gather(*(one(c, model, i) for i in range(NUM_PROMPTS))))

    return asyncio.run(main())


def _differing(alone: list[Any], together: list[Any]) -> list[int]:
    assert all(len(lps) == MAX_TOKENS for _, lps in alone + together)
    return [i for i in range(NUM_PROMPTS) if alone[i] != together[i]]


def test_test_servers_run_the_default_numerics() -> None:
    """The shared server's flags (BASE_ARGS) leave every setting that can change a
    request's numbers at its default, so the tests below check the default mode."""
    from server.cli import parse_args

    base, default = parse_args(list(BASE_ARGS)).engine, parse_args([]).engine
    for name in ("batch_invariant", "linear_routing", "dtype", "quantization",
                 "quantization_activations", "kv_cache_dtype", "enable_prefix_caching",
                 "max_num_batched_tokens", "max_num_seqs", "block_size", "num_threads"):
        assert getattr(base, name, None) == getattr(default, name, None), name


def test_prompts_reach_chunking_and_prefix_hits(server: str) -> None:
    """What the prompts exercise: together they overrun a step's token budget (so some are
    prefilled in chunks), and a third share a prefix of many KV blocks."""
    from server.cli import parse_args

    engine = parse_args(list(BASE_ARGS)).engine
    lengths = [_tokens(server, p) for p in PROMPTS]
    assert sum(lengths) > 2 * engine.max_num_batched_tokens, lengths
    assert max(lengths) < 1024 - MAX_TOKENS  # BASE_ARGS' --max-model-len
    assert len(set(lengths)) > NUM_PROMPTS // 2
    shared = len(PROMPTS[0].split(" Entry")[0].split())
    assert shared > 8 * engine.block_size


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_alone_equals_concurrent(server: str, seeded: bool) -> None:
    hits_before = _prefix_hits(server)
    alone = _one_at_a_time(server, seeded)
    together = _all_at_once(server, seeded)
    # the shared prefix and the first pass's blocks were found in the cache
    assert _prefix_hits(server) > hits_before
    differ = _differing(alone, together)
    texts = [i for i in differ if alone[i][0] != together[i][0]]
    assert differ == [], (f"{len(differ)} of {NUM_PROMPTS} differ ({len(texts)} in their "
                          "text, the rest in logprobs only): "
                          + "; ".join(f"#{i}: {alone[i][0]!r} vs {together[i][0]!r}"
                                      for i in texts[:3]))


def _prefix_hits(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return metric(text, "vllm:prefix_cache_hits_total") or 0.0

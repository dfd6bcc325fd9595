"""`python -m server` as a subprocess with the real default model, through the openai SDK."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("actors.loader") is None,
                       reason="the model loader is not built yet"),
]
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", str(port), "--max-model-len", "1024",
         "--kv-cache-memory", "256m", "--drain-timeout", "20", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode()[-2000:])
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server + "/v1", api_key="unused")


def test_completions_greedy_is_repeatable(client):
    a = client.completions.create(model=None, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    b = client.completions.create(model=None, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    assert a.usage.completion_tokens == 8


def test_stream_n_logprobs_usage(client):
    stream = client.completions.create(model=None, prompt="Once upon a time", max_tokens=6,
                                       n=2, temperature=0.8, seed=1, logprobs=2, stream=True,
                                       stream_options={"include_usage": True})
    finishes, usage = {}, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert set(finishes) == {0, 1} and usage.completion_tokens == 12


def test_chat_sync_and_stream(client):
    r = client.chat.completions.create(model=None, max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "Say hi"}])
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=None, max_tokens=8, temperature=0, stream=True,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content


def test_token_ids_echo_and_stop(client):
    r = client.completions.create(model=None, prompt=[[504, 3458]], max_tokens=4,
                                  temperature=0, echo=True)
    assert r.usage.prompt_tokens == 2 and len(r.choices[0].text) > 0
    full = client.completions.create(model=None, prompt="1, 2, 3, 4,", max_tokens=12,
                                     temperature=0).choices[0].text
    stop = full.strip()[2:5]
    cut = client.completions.create(model=None, prompt="1, 2, 3, 4,", max_tokens=12,
                                    temperature=0, stop=[stop]).choices[0]
    assert stop not in cut.text and cut.finish_reason == "stop"


async def test_async_64_streams(server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    counts = []

    async def one(i):
        stream = await client.completions.create(
            model=None, prompt=f"Count {i}:", max_tokens=8, ignore_eos=True, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage:
                counts.append(chunk.usage.completion_tokens)

    async with trio.open_nursery() as n:
        for i in range(64):
            n.start_soon(one, i)
    assert counts == [8] * 64


def test_sigterm_drains():
    proc, url = start_server()
    with httpx.Client(base_url=url, timeout=60) as c, c.stream(
            "POST", "/v1/completions",
            json={"prompt": "Hi", "max_tokens": 40, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        next(lines)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 503
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" or "data: [DONE]" in rest
    assert proc.wait(60) == 0

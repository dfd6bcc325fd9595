"""The bound on inputs per pooling request (--max-pooling-inputs) through a real server.

The default model with --pooler-config serves the pooling routes beside generation; the
server here takes at most 8 inputs per request. For every route and every list field that
makes inputs (input, texts, queries, documents, text_1, text_2, data_1, data_2), one more
than the bound is a 400 whose `param` names the field, exactly the bound is served, the
server stays healthy and a canary embedding is unchanged afterwards. Bodies that pydantic
would answer with one error per item (a long list of the wrong type) are refused before
parsing, in a few milliseconds. The default bound (2048) is checked on the encoder model in
test_server_embeddings.py; the pooling-flood chaos scenario runs against this server too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from server_helpers import ServerProcess
from subproc import child_env

BOUND = 8
CANARY = "A canary sentence about the sea."
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def too_long(param: str, n: int, bound: int = BOUND) -> str:
    return (f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{bound}, but got an array with length {n} instead.")


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--pooler-config", '{"pooling_type": "MEAN"}',
                         "--max-pooling-inputs", str(BOUND)).wait_ready()
    proc.canary = embedding(proc, CANARY)  # type: ignore[attr-defined]
    yield proc
    proc.stop()


def post(server: ServerProcess, path: str, body: Any, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def embedding(server: ServerProcess, text: str) -> np.ndarray:
    r = post(server, "/v1/embeddings", {"input": text})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["data"][0]["embedding"])


def assert_still_serving(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    np.testing.assert_allclose(embedding(server, CANARY), server.canary, atol=1e-6)


def assert_refused(r: httpx.Response, param: str, message: str | None = None) -> None:
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400, err
    assert err["param"] == param, err
    if message is not None:
        assert err["message"] == message, err


def strings(n: int) -> list[str]:
    return [chr(ord("a") + i % 26) for i in range(n)]


def token_lists(n: int) -> list[list[int]]:
    return [[100 + i] for i in range(n)]


# (route, body with n inputs, the field named)
OVER: list[tuple[str, Any, str]] = [
    ("/v1/embeddings", lambda n: {"input": strings(n)}, "input"),
    ("/v1/embeddings", lambda n: {"input": token_lists(n)}, "input"),
    ("/pooling", lambda n: {"input": strings(n)}, "input"),
    ("/pooling", lambda n: {"input": token_lists(n)}, "input"),
    ("/v2/embed", lambda n: {"texts": strings(n)}, "texts"),
    ("/score", lambda n: {"text_1": "query", "text_2": strings(n)}, "text_2"),
    ("/v1/score", lambda n: {"queries": "query", "documents": strings(n)}, "documents"),
    ("/v1/score", lambda n: {"data_1": strings(n), "data_2": strings(n)}, "data_1"),
    ("/score", lambda n: {"queries": strings(n), "documents": "doc"}, "queries"),
    ("/rerank", lambda n: {"query": "query", "documents": strings(n)}, "documents"),
    ("/v1/rerank", lambda n: {"query": "query", "documents": strings(n)}, "documents"),
    ("/v2/rerank", lambda n: {"query": "query",
                              "documents": [{"text": t} for t in strings(n)]}, "documents"),
    ("/invocations", lambda n: {"input": strings(n)}, "input"),
    ("/invocations", lambda n: {"query": "query", "documents": strings(n)}, "documents"),
]
IDS = [f"{path.strip('/').replace('/', '_')}-{param}-{i}"
       for i, (path, _, param) in enumerate(OVER)]


@pytest.mark.parametrize("path, body, param", OVER, ids=IDS)
def test_one_more_than_the_bound_is_refused_naming_the_field(server, path, body, param) -> None:
    r = post(server, path, body(BOUND + 1))
    assert_refused(r, param, too_long(param, BOUND + 1))
    assert_still_serving(server)


@pytest.mark.parametrize("path, body, param", OVER, ids=IDS)
def test_exactly_the_bound_is_served(server, path, body, param) -> None:
    req = body(BOUND)
    if param == "queries":  # N:1 is not a shape score takes; N:N is
        req = {"queries": strings(BOUND), "documents": strings(BOUND)}
    r = post(server, path, req)
    assert r.status_code == 200, r.text[:500]
    got = r.json()
    if path == "/v2/embed":
        assert len(got["embeddings"]["float"]) == BOUND
    elif "results" in got:  # rerank: one result per document
        assert sorted(x["index"] for x in got["results"]) == list(range(BOUND))
    else:
        assert [d["index"] for d in got["data"]] == list(range(BOUND))


def test_the_bound_counts_inputs_not_tokens(server) -> None:
    # A flat list of ids is one prompt, however many ids (here 5 x the bound).
    ids = list(range(100, 100 + 5 * BOUND))
    r = post(server, "/v1/embeddings", {"input": ids})
    assert r.status_code == 200, r.text[:500]
    assert len(r.json()["data"]) == 1 and r.json()["usage"]["prompt_tokens"] == len(ids)
    # The bound's worth of token lists, each longer than the bound.
    r = post(server, "/pooling", {"input": [ids] * BOUND})
    assert r.status_code == 200 and len(r.json()["data"]) == BOUND
    # Score N:N at the bound is 2 x the bound prompts, served.
    r = post(server, "/score", {"text_1": strings(BOUND), "text_2": strings(BOUND)})
    assert r.status_code == 200 and len(r.json()["data"]) == BOUND


def not_token_ids(i: int) -> str:
    return f"Invalid 'input[{i}]': a list in input must hold token ids (integers) only."


@pytest.mark.parametrize("path, body, param, message", [
    # a long list whose items are of the wrong type: one validation error per item
    ("/v1/embeddings", {"input": [1] + ["a"] * 300_000}, "input",
     too_long("input", 300_001)),
    ("/v1/embeddings", {"input": [["a"] * 300_000]}, "input", not_token_ids(0)),
    ("/pooling", {"input": [[1], [2, "x"] + [3.5] * 300_000]}, "input", not_token_ids(1)),
    ("/v2/embed", {"texts": [1] * 300_000}, "texts", too_long("texts", 300_000)),
    ("/v2/embed", {"texts": ["a"], "embedding_types": [1] * 300_000}, "embedding_types",
     too_long("embedding_types", 300_000)),
    ("/v1/score", {"text_1": "q", "text_2": [1] * 300_000}, "text_2",
     too_long("text_2", 300_000)),
    ("/v1/rerank", {"query": "q", "documents": [1] * 300_000}, "documents",
     too_long("documents", 300_000)),
])
def test_long_malformed_lists_are_refused_before_parsing(server, path, body, param,
                                                         message) -> None:
    t0 = time.monotonic()
    r = post(server, path, body)
    elapsed = time.monotonic() - t0
    assert_refused(r, param, message)
    # pydantic would list 300 000 errors first: about a second of the event loop
    assert "validation error" not in r.json()["error"]["message"]
    assert elapsed < 1.0, elapsed
    assert_still_serving(server)


def test_a_flood_of_huge_requests_is_refused_fast_and_harms_nothing(server) -> None:
    """200 000 inputs per request (the bodies ~800 kB), 8 at once, beside requests at the
    bound: every over-bound one is 400 in well under a second, the others are served."""
    import trio

    huge = {"input": ["a"] * 200_000}
    at_bound = {"input": strings(BOUND)}
    over: list[tuple[int, float]] = []
    served: list[int] = []
    health: list[int] = []

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            async def flood() -> None:
                t0 = time.monotonic()
                r = await client.post("/v1/embeddings", json=huge)
                over.append((r.status_code, time.monotonic() - t0))

            async def normal() -> None:
                r = await client.post("/v1/embeddings", json=at_bound)
                served.append(r.status_code)

            async with trio.open_nursery() as n:
                for _ in range(8):
                    n.start_soon(flood)
                for _ in range(2):
                    n.start_soon(normal)
                for _ in range(5):
                    health.append((await client.get("/health")).status_code)
                    await trio.sleep(0.05)

    trio.run(main)
    assert [s for s, _ in over] == [400] * 8
    assert max(t for _, t in over) < 3.0, over  # 8 bodies of 800 kB on a shared CPU
    assert served == [200, 200] and set(health) == {200}
    assert_still_serving(server)


def test_chaos_pooling_flood_scenario(server) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "chaos.py"), "--url", server.url,
         "--scenarios", "pooling-flood", "--pooling-bound", str(BOUND), "--flood-over", "9",
         "--flood-at", "2"],
        capture_output=True, text=True, env=child_env(), timeout=300)
    out = json.loads(done.stdout)
    flood = out["pooling_flood"]
    assert done.returncode == 0 and out["ok"], (done.stderr[-2000:], flood)
    assert flood["bound"] == BOUND and flood["over_bound"]["statuses"] == {"400": 9}
    assert flood["at_bound"]["statuses"] == {"200": 2}
    assert flood["canary_stream"]["unchanged_after"] and flood["pooling_canary"]["unchanged"]
    # this server's linear routing is off: the stream beside the flood is the same text
    assert flood["canary_stream"]["same_text_as_alone"]
    assert set(out["checks"]) == {"pooling_flood"}


def test_the_flag_is_a_positive_integer() -> None:
    from server.cli import parse_args

    assert parse_args([]).max_pooling_inputs == 2048
    assert parse_args(["--max-pooling-inputs", "1"]).max_pooling_inputs == 1
    for bad in ("0", "-5", "many"):
        done = subprocess.run([sys.executable, "-m", "server", "--max-pooling-inputs", bad],
                              capture_output=True, text=True, env=child_env(), timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "--max-pooling-inputs" in done.stderr, done.stderr[-2000:]
        assert ("must be at least 1" if bad != "many" else "not an integer") in done.stderr

"""API keys: every route but /health and /ping; no path trick slips past."""

from __future__ import annotations

import httpx
import pytest
import trio

from server.auth import normalise_path
from server_helpers import ServerProcess


def test_normalise_path():
    def n(raw: bytes, path: str | None = None) -> str:
        return normalise_path({"raw_path": raw, "path": path or raw.decode()})

    assert n(b"//v1//models") == "/v1/models"
    assert n(b"/v1/%6dodels") == "/v1/models"
    assert n(b"/health/../v1/models") == "/v1/models"
    assert n(b"/%2576%31/models") == "/v1/models"
    assert n(b"http://evil/v1/models") == "/v1/models"


async def _raw(port: int, request: bytes) -> int:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while b"\r\n" not in data:
            data += await stream.receive_some(4096)
    return int(data.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def keyed_server():
    """The real server with a key from the environment (as a deployment would set it)."""
    srv = ServerProcess(env={"LLMSERVE_API_KEY": "sekret"}).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.mark.slow
async def test_api_key_everywhere(keyed_server):
    port = str(keyed_server.port)
    async with httpx.AsyncClient(base_url=keyed_server.url, timeout=60) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ping")).status_code == 200
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions"), ("POST", "/invocations"),
                             ("POST", "/tokenize"), ("POST", "/detokenize"),
                             ("GET", "/metrics"), ("GET", "/server_info"), ("GET", "/load"),
                             ("GET", "/tokenizer_info"), ("GET", "/openapi.json"),
                             ("GET", "/nonexistent")]:
            r = await c.request(method, path, json={})
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == 401
            r = await c.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401, path
        good = {"Authorization": "Bearer sekret"}
        assert (await c.get("/v1/models", headers=good)).status_code == 200
        r = await c.post("/v1/completions", headers=good, json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200
    p = int(port)
    # Tricks that rebuilt-URL checks fall for: Host header, double slash, encoded, dot segments.
    for req in [b"GET /v1/models HTTP/1.1\r\nHost: x/?\r\n\r\n",
                b"GET //v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /v1/%6dodels HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /health/../v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /health/%2e%2e/v1/models HTTP/1.1\r\nHost: x\r\n\r\n"]:
        assert await _raw(p, req) == 401, req
    assert await _raw(p, b"GET /v1/models HTTP/1.1\r\nHost: x/?\r\n\r\n") == 401


@pytest.mark.slow
def test_openai_sdk_with_and_without_key(keyed_server):
    import openai

    with openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekret", max_retries=0) as c:
        assert c.models.list().data[0].id == "SmolLM2-135M-Instruct"
    with openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="nope", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2)


@pytest.mark.slow
def test_pooled_client_never_meets_a_connection_closed_after_an_early_401(keyed_server):
    """The 401 answers before a large body has arrived. The connection either stays usable
    (the rest of the body is read and dropped) or the response says `Connection: close`: a
    pooled client reusing it never finds it dead."""
    body = b'{"prompt": "' + b"x" * 200_000 + b'"}'
    failures: list[str] = []
    with httpx.Client(base_url=keyed_server.url, timeout=30) as c:
        for _ in range(300):
            try:
                r = c.post("/v1/completions", content=body,
                           headers={"Content-Type": "application/json"})
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            assert r.status_code == 401, r.text[:300]
        assert c.get("/health").status_code == 200
    assert not failures, (len(failures), failures[:3])

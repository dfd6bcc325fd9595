"""API keys: every route but /health and /ping; no path trick slips past.

The routes are not listed here: they are read from the app's url_map, built in-process with
every optional route family on (dev endpoints, runtime LoRA, scale-out, tokens-only,
profiler, pooling, offline docs, a Whisper model's audio routes), so a route added later is
checked for its key without a change here."""

from __future__ import annotations

import dataclasses
import re

import httpx
import pytest
import trio

from server.auth import normalise_path
from server_helpers import ServerProcess

KEY = "sekret"
PUBLIC = {"/health", "/ping", "/ready", "/readyz"}  # the probes
# Not settings: a server's environment as a deployment might leave it.
SECRET_ENV = {"SOME_SECRET_TOKEN": "xyz-token-value", "VLLM_FOO_SECRET": "abc-secret-value"}


def _app(model: str | None = None, **overrides):
    """The real app (create_app: routes and the key middleware), no engine, with every
    ``enable_*``/``allow_*`` flag of ServerConfig on, the profiler and pooling configured,
    then ``overrides``."""
    from actors.config import EngineConfig
    from server import app as app_module
    from server.config import ServerConfig
    from server.state import ServerState

    cfg = ServerConfig(engine=EngineConfig(model=model), served_model_names=[model or "default"],
                       api_keys=[KEY], profiler_config={"profiler": "torch",
                                                        "torch_profiler_dir": "/nonexistent"},
                       pooler_config='{"pooling_type": "MEAN"}')
    for f in dataclasses.fields(cfg):
        if f.name.startswith(("enable_", "allow_")) and isinstance(getattr(cfg, f.name), bool):
            setattr(cfg, f.name, True)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    srv = ServerState(config=cfg)
    srv.health.loading = False
    return app_module.create_app(srv)


def _concrete(rule: str) -> str:
    """A path the rule matches: each variable part replaced by a value it takes."""
    rule = re.sub(r"<any\('([^']*)'[^>]*>", r"\1", rule)
    return re.sub(r"<[^>]+>", "1", rule)


def _routes(*apps) -> set[tuple[str, str]]:
    return {(method, _concrete(r.rule)) for app in apps for r in app.url_map.iter_rules()
            for method in r.methods - {"OPTIONS"}}


def every_route() -> set[tuple[str, str]]:
    """(method, path) of every route any configuration mounts."""
    return _routes(_app(), _app(tokens_only=True, enable_dev_endpoints=False),
                   _app("whisper-base"))


async def test_every_route_in_the_url_map_needs_the_key():
    routes = every_route()
    paths = {p for _, p in routes}
    # each optional family is really on (else this would check less than it says)
    assert {"/pause", "/start_profile", "/v1/load_lora_adapter", "/inference/v1/generate",
            "/v1/embeddings", "/v1/audio/transcriptions", "/abort_requests", "/docs",
            "/v1/responses/1"} <= paths, sorted(paths)
    open_without_key = set()
    for app in (_app(), _app(tokens_only=True, enable_dev_endpoints=False),
                _app("whisper-base")):
        client = app.test_client()
        for method, path in sorted(_routes(app)):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
                r = await client.open(path, method=method, headers=headers, json={})
                if r.status_code != 401:
                    open_without_key.add((method, path, r.status_code))
    assert {p for _, p, _ in open_without_key} == PUBLIC, sorted(open_without_key)


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
    """The real server with a key from the environment (as a deployment would set it), its
    operator routes on, and secrets in its environment that no route may show."""
    srv = ServerProcess("--enable-dev-endpoints",
                        env={"LLMSERVE_API_KEY": KEY, **SECRET_ENV}).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.mark.slow
def test_server_info_shows_named_settings_only(keyed_server):
    r = httpx.get(keyed_server.url + "/server_info", timeout=60,
                  headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    for name, value in {**SECRET_ENV, "LLMSERVE_API_KEY": KEY}.items():
        assert name not in r.text and value not in r.text, name
    from server.api.dev import SERVER_INFO_ENV

    env = r.json()["env"]
    assert set(env) <= set(SERVER_INFO_ENV), sorted(set(env) - set(SERVER_INFO_ENV))
    assert env["LLMSERVE_STATE_DIR"]  # a named setting is shown (ServerProcess sets it)


@pytest.mark.slow
async def test_api_key_everywhere(keyed_server):
    port = str(keyed_server.port)
    async with httpx.AsyncClient(base_url=keyed_server.url, timeout=60) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ping")).status_code == 200
        routes = sorted(every_route() | {("GET", "/nonexistent")})
        assert len(routes) > 50
        for method, path in routes:
            if path in PUBLIC:
                continue
            r = await c.request(method, path, json={})
            assert r.status_code == 401, (method, path)
            if method != "HEAD":  # no body to a HEAD
                err = r.json()["error"]  # OpenAI's envelope, or Anthropic's on its routes
                assert err.get("code") == 401 or err["type"] == "authentication_error", path
            r = await c.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401, (method, path)
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

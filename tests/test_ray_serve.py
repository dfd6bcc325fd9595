"""The server as a Ray Serve deployment (server.ray_serve), on a one-node Ray cluster.

`ray start --head` on loopback, then `serve run` with a Serve config file that deploys
`server.ray_serve:build_app` with two replicas; every request goes through Ray's HTTP proxy:
completions and chat with the openai SDK (plain and streamed), the OpenAI error envelope,
both replicas serving the same greedy text, a client that disconnects mid-stream (its
sequence is aborted on the replica), and `serve run`'s Ctrl-C removing the application.
The builder's argument handling (autoscaling passed through, bad flags refused before any
replica starts) is checked without a cluster.

Skipped, with the import error, when Ray Serve is not installed (pip install "llmserve[ray]").
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import free_port
from subproc import child_env

try:
    import ray  # noqa: F401
    from ray import serve  # noqa: F401
except ImportError as exc:
    pytest.skip(f"Ray Serve is not installed ({exc}); pip install 'llmserve[ray]'",
                allow_module_level=True)

from server.ray_serve import DEFAULT_MAX_ONGOING_REQUESTS, build_app

MODEL = "SmolLM2-135M-Instruct"
# The default, batch-invariant mode: the two replicas' greedy texts are compared
SERVER_ARGS = "--max-model-len 1024 --kv-cache-memory 128m --max-num-seqs 8 --drain-timeout 10"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


class RayCluster:
    """A one-node Ray cluster on loopback and one `serve run` of the server's app."""

    def __init__(self) -> None:
        # Ray's socket paths must stay short (AF_UNIX): a short directory of our own.
        self.temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self.gcs_port = free_port()
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.env = child_env(RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS=f"127.0.0.1:{self.gcs_port}",
                             RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
        self.serve_log = open(Path(self.temp) / "serve-run.log", "w+b")
        self.serve: subprocess.Popen[bytes] | None = None

    def start(self) -> RayCluster:
        subprocess.run(
            [_tool("ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
             "--port", str(self.gcs_port), "--num-cpus", "4", "--include-dashboard=false",
             "--object-store-memory", str(100 * 1024 * 1024), "--temp-dir", self.temp,
             "--disable-usage-stats"],
            env=self.env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=120)
        config = Path(self.temp) / "serve.json"  # YAML is a superset of JSON
        config.write_text(json.dumps({
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": self.http_port},
            "applications": [{
                "name": "llm", "route_prefix": "/",
                "import_path": "server.ray_serve:build_app",
                "args": {"server_args": SERVER_ARGS, "num_replicas": 2,
                         "ray_actor_options": {"num_cpus": 1}},
            }],
        }))
        # `serve run` must start with SIGINT's default action, whatever this process has:
        # under a shell's background job SIGINT is ignored, a child inherits that across
        # exec, and Ctrl-C (the test below) would then never reach it. A handled signal
        # resets to the default on exec, so handle it here while the child starts.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.serve = subprocess.Popen([_tool("serve"), "run", str(config)], env=self.env,
                                          stdin=subprocess.DEVNULL, stdout=self.serve_log,
                                          stderr=subprocess.STDOUT)
        finally:
            signal.signal(signal.SIGINT, previous)
        return self

    def log(self) -> str:
        self.serve_log.seek(0)
        return self.serve_log.read().decode(errors="replace")[-6000:]

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.serve is not None
            if self.serve.poll() is not None:
                raise RuntimeError(f"serve run exited with {self.serve.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"the app was not ready in {timeout:.0f} s:\n{self.log()}")

    def stop_serve(self, timeout: float = 90) -> int | None:
        """Ctrl-C to `serve run`: it deletes the application (the replicas drain) and exits."""
        if self.serve is None or self.serve.poll() is not None:
            return None if self.serve is None else self.serve.returncode
        self.serve.send_signal(signal.SIGINT)
        try:
            return self.serve.wait(timeout)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            return self.serve.wait()

    def ray_logs(self, tail: int = 3000) -> str:
        """The tail of Serve's controller log (what it did with the application)."""
        logs = sorted(Path(self.temp).glob("session_*/logs/serve/controller_*.log"))
        return "".join(p.read_text(errors="replace")[-tail:] for p in logs)

    def close(self) -> None:
        self.stop_serve()
        subprocess.run([_tool("ray"), "stop", "--force"], env=self.env, timeout=120, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.serve_log.close()
        if not os.environ.get("KEEP_RAY_TEMP"):  # set it to read the replicas' logs after
            shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("Ray's object store needs a writable /dev/shm")
    ray_cluster = RayCluster()
    try:
        ray_cluster.start()
        ray_cluster.wait_ready()
        yield ray_cluster
    finally:
        ray_cluster.close()


@pytest.fixture(scope="module")
def client(cluster: RayCluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0,
                       timeout=120) as c:
        yield c


def test_completion_and_stream_through_rays_proxy(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 12
    assert full.choices[0].text.strip()
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                       temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_matches_the_plain_answer(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                           temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_errors_keep_the_openai_envelope(cluster: RayCluster, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)
    assert bad.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    r = httpx.post(cluster.url + "/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == 400


def test_both_replicas_serve_the_same_greedy_text(cluster: RayCluster) -> None:
    def one(_: int) -> tuple[str, str]:
        r = httpx.post(cluster.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.headers["x-replica-id"], r.json()["choices"][0]["text"]

    seen: dict[str, set[str]] = {}
    for _ in range(3):  # Ray's router picks the less loaded of two: both get some
        with ThreadPoolExecutor(8) as pool:
            for replica, text in pool.map(one, range(8)):
                seen.setdefault(replica, set()).add(text)
        if len(seen) >= 2:
            break
    assert len(seen) == 2, f"one replica served everything: {seen}"
    texts = set().union(*seen.values())
    assert len(texts) == 1, texts


def running(cluster: RayCluster) -> dict[str, float]:
    """vllm:num_requests_running of whichever replicas answered a burst of /metrics scrapes.

    The scrapes go out at once: Ray's router sends a lone request to the replica with the
    fewest in flight, so one at a time they could all land on the same replica; eight in
    flight together spread over both."""
    def scrape(_: int) -> tuple[str, float | None]:
        r = httpx.get(cluster.url + "/metrics", timeout=10)
        for line in r.text.splitlines():
            if line.startswith("vllm:num_requests_running{"):
                return r.headers["x-replica-id"], float(line.rsplit(" ", 1)[1])
        return r.headers["x-replica-id"], None

    out: dict[str, float] = {}
    with ThreadPoolExecutor(8) as pool:
        for replica, value in pool.map(scrape, range(8)):
            if value is not None:
                out[replica] = value
    return out


def test_a_client_that_leaves_mid_stream_frees_its_sequence(cluster: RayCluster) -> None:
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 900,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        replica = r.headers["x-replica-id"]
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events >= 5:
                break
    # The stream had ~900 tokens to go; on its replica the sequence must end long before.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counts = running(cluster)
        if replica in counts and counts[replica] == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"replica {replica} still runs the abandoned stream: {running(cluster)}")


def test_serve_run_ctrl_c_removes_the_app(cluster: RayCluster) -> None:
    code = cluster.stop_serve()
    assert code == 0, f"{cluster.log()}\n--- Serve's controller ---\n{cluster.ray_logs()}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(cluster.url + "/v1/models", timeout=5).status_code == 404:
                return  # the proxy is still up; no app holds the route
        except httpx.HTTPError:
            return
        time.sleep(0.5)
    pytest.fail("the application still answered after serve run stopped")


# -- the builder, without a cluster -------------------------------------------------------
def test_builder_passes_autoscaling_and_resources_through() -> None:
    app = build_app({
        "server_args": "--max-model-len 512 --drain-timeout 7",
        "autoscaling_config": '{"min_replicas": 1, "max_replicas": 3, '
                              '"target_ongoing_requests": 32}',
        "ray_actor_options": '{"num_cpus": 2}',
    })
    deployment = app._bound_deployment
    assert deployment.init_args == (["--max-model-len", "512", "--drain-timeout", "7"],)
    config = deployment._deployment_config
    assert (config.autoscaling_config.min_replicas, config.autoscaling_config.max_replicas,
            config.autoscaling_config.target_ongoing_requests) == (1, 3, 32)
    assert config.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS
    assert config.graceful_shutdown_timeout_s == 17
    assert deployment.ray_actor_options["num_cpus"] == 2
    assert deployment.ray_actor_options["runtime_env"]["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"
    fixed = build_app({"num_replicas": "2", "max_ongoing_requests": "64", "name": "smol"})
    assert fixed._bound_deployment.name == "smol"
    assert fixed._bound_deployment._deployment_config.num_replicas == 2
    assert fixed._bound_deployment._deployment_config.max_ongoing_requests == 64


@pytest.mark.parametrize("flags, message", [
    ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
    ("--max-model-len abc", "--max-model-len"),
])
def test_builder_refuses_bad_flags_before_any_replica(flags: str, message: str) -> None:
    with pytest.raises(ValueError, match="server_args") as refused:
        build_app({"server_args": flags})
    assert message in str(refused.value)


# -- a replica's host, in this process (no cluster) ---------------------------------------
def _asgi_post(path: str, body: dict) -> tuple[dict, list[dict], asyncio.Event]:
    raw = json.dumps(body).encode()
    delivered = False
    gone = asyncio.Event()

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"host", b"replica")]}
    return scope, sent, (receive, send, gone)  # type: ignore[return-value]


def test_a_failed_engine_fails_the_replicas_health_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine fails on its 3rd step: the request in flight gets an error, the host's
    loop ends, and check_health raises (Ray then replaces the replica)."""
    from server.cli import parse_args
    from server.ray_serve import LLMServer, TrioHost, _Bridge

    monkeypatch.setenv("LLMSERVE_FAULT_INJECT", "engine:3")

    async def scenario() -> tuple[int, bytes, bool, bool]:
        host = TrioHost(parse_args(SERVER_ARGS.split()))
        host.start()
        await host.wait_ready()
        healthy_before = host.healthy
        scope, sent, (receive, send, _) = _asgi_post(
            "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 50})
        await asyncio.wait_for(_Bridge(host)(scope, receive, send), 60)
        for _ in range(200):  # the supervisor stops serving once the failure is handled
            if not host.alive:
                break
            await asyncio.sleep(0.1)
        with pytest.raises(RuntimeError, match="engine has failed"):
            LLMServer.check_health(SimpleNamespace(_host=host))  # the probe, on this host
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return sent[0]["status"], body, healthy_before, host.alive

    status, body, healthy_before, alive_after = asyncio.run(scenario())
    assert healthy_before
    assert status >= 500 and b'"error"' in body
    assert not alive_after

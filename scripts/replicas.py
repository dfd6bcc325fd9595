"""N `python -m server` replicas behind vLLM's router (`vllm-router`, a PyPI wheel), on loopback.

    python scripts/replicas.py --replicas 2 --policy round_robin [--hold] [-- <server args>]

Starts the replicas on free loopback ports, waits for each one's /health, starts
`vllm-router --worker-urls ...` in front of them and waits for the router to answer
/v1/models. With `--policy kv_aware` each replica also publishes its KV-cache events
(`--kv-events-config`, a free port each) and serves the render routes the router tokenizes
with (`--enable-scale-out`), and the router subscribes to every replica's events
(`--kv-event-source URL=tcp://127.0.0.1:PORT`, vllm-router's static sources).
Prints one JSON document on stdout (the router's URL and metrics URL, each replica's URL,
pid and KV-event endpoint, the policy); progress goes to stderr. Without --hold it then tears everything down
(the set came up: exit 0); with --hold it serves until SIGTERM or SIGINT, then tears down.
Tear-down is the order a rolling restart uses: the router first (no new traffic), then each
replica with SIGTERM (it drains its in-flight requests and exits 0).

The router polls /health on each replica (--health-check-endpoint) and retries a request
that got a 5xx or no connection on another worker; the intervals here are short so that a
test sees a dead or drained replica within a second or two.

The replica and router classes are imported by tests/test_router.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from server_under_test import free_port, log

POLICIES = ("round_robin", "cache_aware", "kv_aware", "power_of_two", "random",
            "consistent_hash")


def kv_events_args(port: int) -> list[str]:
    """A replica's flags for vllm-router's kv_aware policy: KV events on `port` (vLLM's
    default topic, ""; the router's static sources read only that), and the render routes.
    A named host is connected to by vLLM's rule, so the publisher binds the wildcard: every
    interface, where any host that reaches the port reads the cached prompts' tokens."""
    cfg = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"}
    return ["--enable-scale-out", "--kv-events-config", json.dumps(cfg)]


class Replica:
    """One `python -m server` on a fixed loopback port; it can be stopped and started again on
    the same port (the router knows its workers by URL)."""

    def __init__(self, args: list[str], port: int | None = None,
                 kv_events: bool = False) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # where a subscriber on this host reads the replica's KV events (None: not published)
        self.kv_events_endpoint: str | None = None
        if kv_events:
            kv_port = free_port()
            self.kv_events_endpoint = f"tcp://127.0.0.1:{kv_port}"
            args = [*args, *kv_events_args(kv_port)]
        self.args = args
        self._state = tempfile.TemporaryDirectory(prefix="llmserve-replica-")
        self._log = tempfile.TemporaryFile()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
               "LLMSERVE_STATE_DIR": self._state.name}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--enable-request-id-headers", *self.args],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=env)
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 300) -> None:
        wait_http(self.url + "/health", timeout, self.alive, self.log_tail)

    def log_tail(self, limit: int = 4000) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signum)

    def wait(self, timeout: float = 60) -> int | None:
        """The exit code, or None (the process is then killed) if it did not exit in time."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None

    def stop(self, timeout: float = 60) -> int | None:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def close(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        self._state.cleanup()


def router_command() -> list[str] | None:
    """How to start vllm-router here: its console script, or None when it is not installed."""
    exe = shutil.which("vllm-router")
    if exe is None:
        scripts_dir = os.path.dirname(sys.executable)
        candidate = os.path.join(scripts_dir, "vllm-router")
        exe = candidate if os.path.exists(candidate) else None
    return None if exe is None else [exe]


class Router:
    """vllm-router in front of the given worker URLs, with short health-check intervals and
    its Prometheus exposition on a free port of its own (`metrics_url`). `kv_sources` maps a
    worker URL to the ZMQ endpoint of its KV events, for the kv_aware policy; the router then
    needs the model those workers serve (`kv_model`, its cache identity for the events)."""

    def __init__(self, worker_urls: list[str], policy: str, extra: list[str] | None = None,
                 kv_sources: dict[str, str] | None = None, kv_model: str | None = None):
        cmd = router_command()
        if cmd is None:
            raise SystemExit("vllm-router is not installed (pip install vllm-router)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.policy = policy
        sources = [a for url, endpoint in (kv_sources or {}).items()
                   for a in ("--kv-event-source", f"{url}={endpoint}")]
        if sources:
            sources += ["--kv-event-model", kv_model or served_model(worker_urls[0])]
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
             "--worker-urls", *worker_urls,
             "--health-check-interval-secs", "1", "--health-check-timeout-secs", "2",
             "--health-failure-threshold", "1", "--health-success-threshold", "1",
             "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "120",
             "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "1000",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
             "--log-level", "warning", *sources, *(extra or [])],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 120) -> None:
        wait_http(self.url + "/v1/models", timeout, self.alive, self.log_tail)

    def log_tail(self, limit: int = 4000) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def close(self) -> int | None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def served_model(url: str) -> str:
    """The first model a server lists at /v1/models."""
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def wait_http(url: str, timeout: float, alive: Any, log_tail: Any) -> None:
    """Until GET url answers 200; fails with the process's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise SystemExit(f"{url}: the process exited:\n{log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{url} not ready after {timeout:.0f} s:\n{log_tail()}")


class ReplicaSet:
    """N replicas and a router over them; a context manager that tears all of it down."""

    def __init__(self, n: int, policy: str, server_args: list[str],
                 router_args: list[str] | None = None) -> None:
        self.replicas = [Replica(server_args, kv_events=policy == "kv_aware")
                         for _ in range(n)]
        self.policy = policy
        self.router_args = router_args or []
        self.router: Router | None = None

    def __enter__(self) -> ReplicaSet:
        try:
            for r in self.replicas:
                r.start()
            for i, r in enumerate(self.replicas):
                r.wait_ready()
                log(f"replica {i} ready on {r.url} (pid {r.pid})")
            self.router = Router([r.url for r in self.replicas], self.policy, self.router_args,
                                 kv_sources={r.url: r.kv_events_endpoint for r in self.replicas
                                             if r.kv_events_endpoint})
            self.router.wait_ready()
            log(f"router ready on {self.router.url} ({self.policy})")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        return {"router": None if self.router is None else self.router.url,
                "router_metrics": None if self.router is None else self.router.metrics_url,
                "policy": self.policy,
                "replicas": [{"url": r.url, "pid": r.pid, "alive": r.alive(),
                              "kv_events": r.kv_events_endpoint} for r in self.replicas]}

    def close(self) -> list[int | None]:
        """Router first, then each replica by SIGTERM (drained); the replicas' exit codes."""
        if self.router is not None:
            self.router.close()
        for r in self.replicas:
            r.signal(signal.SIGTERM)
        codes = [r.wait(60) for r in self.replicas]
        for r in self.replicas:
            r.close()
        return codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--policy", choices=POLICIES, default="round_robin")
    ap.add_argument("--hold", action="store_true", help="serve until SIGTERM or SIGINT")
    ap.add_argument("server_args", nargs="*", help="after --: arguments for each replica")
    a = ap.parse_args()
    if a.replicas < 1:
        ap.error("--replicas must be at least 1")
    if router_command() is None:
        print(json.dumps({"ok": False, "error": "vllm-router is not installed"}))
        return 2
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    with ReplicaSet(a.replicas, a.policy, a.server_args) as rs:
        print(json.dumps({"ok": True, **rs.status()}), flush=True)
        if a.hold:
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
            # A replica that dies is the router's to route around; the set ends with the router.
            while not stop and rs.router is not None and rs.router.alive():
                time.sleep(0.5)
        log("tearing down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

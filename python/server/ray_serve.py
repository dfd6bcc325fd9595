"""The server as a Ray Serve deployment: every route of `python -m server`, behind Ray's proxy.

    serve run server.ray_serve:build_app server_args="--max-model-len 2048" num_replicas=2

Each replica runs what `python -m server` runs (the engine core and the Trio actors, the
Quart-Trio app with every route, the API-key check and the error envelopes) on a Trio loop
in a thread of its own. Ray's replica loop (asyncio) hands each HTTP request to that loop as
an ASGI call; the app's `receive` and `send` run back on Ray's loop:

    Ray proxy --> replica (asyncio) --ASGI call--> Trio thread: the app, the actors, the engine
                       ^                                |
                       +---- receive() / send(message) -+   (each a coroutine on Ray's loop)

A client that disconnects makes Ray cancel the call; the bridge cancels the request on the
Trio side, which aborts its sequences as a hang-up does under Hypercorn. Ray owns the
replica's life: `check_health` fails once the engine has failed (Ray then replaces the
replica), and a replica Ray stops drains like SIGTERM does (in-flight requests finish
within --drain-timeout).

Ray is optional (`pip install "llmserve[ray]"`); nothing else imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import shlex
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import trio
from ray import serve

from server.asgi_crossing import Call
from server.cli import parse_args
from server.config import ServerConfig
from server.supervisor import Supervisor

log = logging.getLogger("server.ray_serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

# Ray's default (5 requests in a replica at once) would leave the engine's batch empty;
# the engine admits its own queue and answers 503 beyond it, as it does behind Hypercorn.
DEFAULT_MAX_ONGOING_REQUESTS = 256
READY_TIMEOUT = 600.0  # seconds a replica may take to load its model


class _EmbeddedSupervisor(Supervisor):
    """The supervisor with the bridge as its HTTP front door: no listener of its own (Ray's
    proxy is the listener) and no signal handlers (Ray owns the process's signals and
    stops a replica through its destructor, which drains)."""

    app: Any = None
    _root: trio.Nursery | None = None

    async def _serve_http(self, app: Any, *, task_status: trio.TaskStatus[list[str]]) -> None:
        self.app = app
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(_run_lifespan, app, self._stop_http)
                task_status.started(["ray-serve"])
        finally:
            self._http_done.set()

    async def _watch_signals(self, root: trio.Nursery) -> None:
        self._root = root

    def begin_drain(self) -> None:
        """From the Trio thread: what SIGTERM starts under `python -m server`."""
        if self._root is not None and not self.srv.health.draining:
            self.srv.health.draining = True
            self._root.start_soon(self._drain, self._root.cancel_scope)


async def _run_lifespan(app: Any, stop: trio.Event, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Quart-Trio's ASGI lifespan, as Hypercorn would run it: startup now, shutdown once
    `stop` is set."""
    to_app, app_inbox = trio.open_memory_channel[Message](2)
    app_outbox, from_app = trio.open_memory_channel[Message](2)

    async def receive() -> Message:
        return await app_inbox.receive()

    async def send(message: Message) -> None:
        await app_outbox.send(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                           receive, send)
        await to_app.send({"type": "lifespan.startup"})
        reply = await from_app.receive()
        if reply["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app's startup failed: {reply.get('message', reply)}")
        task_status.started()
        await stop.wait()
        await to_app.send({"type": "lifespan.shutdown"})
        with trio.move_on_after(5):
            await from_app.receive()
        nursery.cancel_scope.cancel()


class TrioHost:
    """The server's Trio side in a thread: start() loads the model and starts the actors,
    call() serves one ASGI request from another event loop, stop() drains."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.supervisor = _EmbeddedSupervisor(config)
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._requests: trio.Nursery | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="llmserve-trio", daemon=True)

    # -- life --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    async def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait (without blocking the caller's loop) until the actors serve, or raise why
        they never will."""
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, self._ready.wait, timeout)
        if self.supervisor.refusal is not None:
            raise RuntimeError(f"cannot serve {self.config.model}: {self.supervisor.refusal}")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error!r}") from self._error
        if not ok:
            raise TimeoutError(f"the server did not start within {timeout:.0f} s")

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:
            self._error = exc
            log.exception("the server's Trio loop ended with an error")
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as requests:
            self._requests = requests
            async with trio.open_nursery() as core:
                await core.start(self.supervisor.run)
                self._ready.set()
            # The supervisor returns after a drain or an engine failure: no request has
            # anything left to run on.
            requests.cancel_scope.cancel()
        self._requests = None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    @property
    def healthy(self) -> bool:
        health = self.supervisor.srv.health
        return self.alive and not health.failed and not health.loading

    async def stop(self) -> None:
        """Drain (requests in flight finish within --drain-timeout) and wait for the loop,
        without blocking the caller's loop: the requests still finishing send through it."""
        if self._token is not None and self._thread.is_alive():
            try:
                self._token.run_sync_soon(self.supervisor.begin_drain)
            except trio.RunFinishedError:
                pass
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._thread.join, self.config.drain_timeout + 15)

    # -- one request -------------------------------------------------------------------
    async def call(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                   send: Callable[[Message], Awaitable[None]]) -> None:
        """Serve one ASGI request (an `http` scope) from the caller's asyncio loop."""
        if self._token is None or self._requests is None or not self._thread.is_alive():
            await _unavailable(send)
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        call = Call(self.supervisor.app, scope, receive, send, loop, done)
        try:
            self._token.run_sync_soon(self._requests.start_soon, call.run)
        except (trio.RunFinishedError, RuntimeError):
            await _unavailable(send)
            return
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            # The client left (or Ray gave up on the call): end the request on the Trio
            # side too, then let Ray see the cancellation.
            call.cancel(self._token)
            raise


async def _unavailable(send: Callable[[Message], Awaitable[None]]) -> None:
    body = json.dumps({"error": {"message": "The server is not running.", "type":
                                 "ServiceUnavailableError", "param": None, "code": 503}})
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body.encode()})


class _Bridge:
    """The ASGI app Ray's replica wrapper calls: lifespan answered here (the Trio side runs
    its own), every HTTP request handed to the host."""

    def __init__(self, host: TrioHost, replica_id: str = "") -> None:
        self.host = host
        self.replica_id = replica_id.encode("ascii", "replace")

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif kind == "http":
            await self.host.call(scope, receive, self._tagged(send))
        # websockets: the server has no websocket route; Ray closes the connection

    def _tagged(self, send: Callable[[Message], Awaitable[None]]
                ) -> Callable[[Message], Awaitable[None]]:
        """`send`, with an X-Replica-Id header on the response: which replica served it
        (Ray's replica id, as `serve status` and Ray's logs name it)."""
        if not self.replica_id:
            return send

        async def tagged(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", ()),
                                      (b"x-replica-id", self.replica_id)]
            await send(message)

        return tagged


@serve.ingress()
class LLMServer:
    """One replica: the whole server on a Trio loop of its own (see the module's text)."""

    async def __init__(self, server_args: list[str] | None = None) -> None:
        config = parse_args(list(server_args or []))
        for name in ("server", "actors"):
            logging.getLogger(name).setLevel(config.log_level.upper())
        self._host = TrioHost(config)
        self._host.start()
        await self._host.wait_ready()
        log.info("replica ready: serving %s", config.served_model_names[0])

    def __serve_build_asgi_app__(self) -> _Bridge:
        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside a replica (a test): no header
            replica_id = ""
        return _Bridge(self._host, replica_id)

    def check_health(self) -> None:
        """Ray's health probe: a failed engine (or a dead loop) fails it, and Ray replaces
        the replica."""
        if not self._host.healthy:
            raise RuntimeError("the engine has failed")

    async def __del__(self) -> None:  # Ray awaits it when it stops the replica
        host = getattr(self, "_host", None)
        if host is not None:
            await host.stop()


def _option(args: Mapping[str, Any], key: str) -> Any:
    """A builder argument: `serve run` passes strings (JSON objects stay strings); a config
    file or a Python caller may pass the value itself."""
    value = args.get(key)
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        return json.loads(value)
    return value


def _checked_flags(server_args: list[str]) -> ServerConfig:
    """The flags as `python -m server` reads them; a bad one is a ValueError carrying
    argparse's message (argparse itself would exit the process Ray builds the app in)."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parse_args(server_args)
    except SystemExit:
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        raise ValueError(f"server_args: {lines[-1] if lines else 'invalid flags'}") from None


def build_app(args: Mapping[str, Any] | None = None) -> Any:
    """The application `serve run` and Serve config files import:

        serve run server.ray_serve:build_app server_args="--max-model-len 2048" \
            num_replicas=2 ray_actor_options='{"num_cpus": 1}'

    Arguments (all optional):
      server_args          `python -m server`'s flags, one string (or a list)
      num_replicas         a count, or "auto" for Ray's autoscaling defaults
      autoscaling_config   Ray Serve's autoscaling settings (JSON), passed through
      max_ongoing_requests requests Ray sends one replica at once (default 256: the
                           engine batches and queues them itself)
      ray_actor_options    each replica's resources (JSON), e.g. {"num_cpus": 2}
      name                 the deployment's name (default LLMServer)

    The flags are checked here, before any replica starts, as `python -m server` checks
    them; --host and --port are Ray's (its proxy listens: `serve start --http-port`).
    """
    args = dict(args or {})
    raw = _option(args, "server_args") or []
    server_args = shlex.split(raw) if isinstance(raw, str) else [str(a) for a in raw]
    config = _checked_flags(server_args)
    options: dict[str, Any] = {
        "name": str(args.get("name") or "LLMServer"),
        "max_ongoing_requests": int(args.get("max_ongoing_requests")
                                    or DEFAULT_MAX_ONGOING_REQUESTS),
        "health_check_period_s": 5,
        "graceful_shutdown_timeout_s": config.drain_timeout + 10,
    }
    autoscaling = _option(args, "autoscaling_config")
    replicas = args.get("num_replicas")
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    elif replicas is not None:
        options["num_replicas"] = replicas if replicas == "auto" else int(replicas)
    actor_options = dict(_option(args, "ray_actor_options") or {})
    env = dict(actor_options.get("runtime_env", {}).get("env_vars", {}))
    # As `python -m server` does before torch loads (see server/__main__.py).
    env.setdefault("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    actor_options.setdefault("runtime_env", {})["env_vars"] = env
    options["ray_actor_options"] = actor_options
    return serve.deployment(LLMServer).options(**options).bind(server_args)

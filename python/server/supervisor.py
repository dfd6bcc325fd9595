"""The process: starts the actors in order under one nursery, serves HTTP, drains, exits.

    engine core (weights + KV) -> engine actor -> tokenizer -> metrics -> HTTP routes live

The listener binds first so that /health can answer 503 while the model loads; every other
route answers 503 until all actors have started. Exit codes: 0 after a drain (SIGTERM or
SIGINT), 1 after an engine failure or an exception out of any actor (every in-flight
request gets an error first, and /health answers 503 meanwhile), 2 when the model cannot be
served (an unsupported architecture, a missing or malformed file: one line, no traceback).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
from hypercorn.trio import serve as hypercorn_serve

from actors.config import EngineConfig
from actors.runtime import faults
from actors.core.protocol import EngineCore
from actors.core.process import ProcessEngineCore
from actors.runtime.data_parallel import DataParallelSystem, run_data_parallel
from actors.runtime.system import ActorSystem, run_actor_system
from server import transport
from server.api import lora
from server.api.elastic import elastic_settings
from server.app import create_app
from server.frontend.chat_template import ChatRenderer, load_template_arg
from server.config import ServerConfig
from actors.params.limits import RequestLimits
from server.errors import LoadRefused
from server.state import ServerState

log = logging.getLogger("server")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
FAIL_GRACE = 2.0  # seconds handlers get to send their error after an engine failure
ABORT_GRACE = 5.0  # seconds aborted requests get to retire after the drain timeout


def make_engine_factory(config: ServerConfig) -> Callable[[], Any]:
    def build() -> Any:
        from actors.core.engine import LLMEngine

        return LLMEngine(config.engine)

    return build


class Supervisor:
    def __init__(self, config: ServerConfig, engine_factory: Callable[[], Any] | None = None):
        self.config = config
        self.srv = ServerState(config)
        self.srv.connections = transport.ConnectionTable(config.max_connections)
        self._engine_factory = engine_factory or make_engine_factory(config)
        faults.configure(os.environ)
        self._stop_http = trio.Event()
        self.exit_code = 0
        self.refusal: str | None = None  # why the model cannot be served (exit code 2)
        self.bound: list[str] = []
        self._fatal: BaseException | None = None
        self._fatal_event = trio.Event()
        self._http_done = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED):
        app = create_app(self.srv)
        async with trio.open_nursery() as root:
            await root.start(self.srv.write_watchdog.run)
            self.bound = await root.start(self._serve_http, app)
            log.info("listening on %s (loading the model)", ", ".join(self.bound))
            root.start_soon(self._watch_signals, root)
            async with trio.open_nursery() as actors:
                self.srv.reaper = actors
                try:
                    await self._start_actors(actors)
                except Exception as exc:
                    refusal = load_refusal(exc)
                    if refusal is None:
                        raise
                    # A model (or adapter) this server cannot serve: one line, exit 2,
                    # as a refused flag does; tracebacks are for bugs.
                    log.error("cannot serve %s: %s", self.config.model or DEFAULT_MODEL_NAME,
                              refusal)
                    self.exit_code = 2
                    self.refusal = refusal
                    self.srv.health.failed = True
                    root.cancel_scope.cancel()
                    return
                self.srv.health.loading = False
                log.info("ready: serving %s", self.srv.model_name)
                task_status.started(self)
                await self._fatal_event.wait()
                await self._after_failure()
                actors.cancel_scope.cancel()
            root.cancel_scope.cancel()

    async def _serve_http(self, app: Any, *, task_status: trio.TaskStatus[list[str]]) -> None:
        transport.install()  # one connection's failure stays in that connection
        hc = transport.TransportConfig(self.srv.connections, self.config.h11_max_header_count)
        hc.bind = [f"{self.config.host}:{self.config.port}"]
        hc.graceful_timeout = self.config.drain_timeout + ABORT_GRACE + 5
        hc.keep_alive_timeout = 5
        hc.include_server_header = False
        hc.backlog = 1024
        hc.h11_max_incomplete_size = 64 * 1024
        # A realtime event over twice the largest audio chunk's base64 is refused by the
        # WebSocket layer (close 1009) before it is buffered; smaller ones reach the route,
        # which answers an oversized chunk with an error event.
        hc.websocket_max_message_size = self.config.realtime_max_chunk_bytes * 8 // 3 + 65536
        hc.accesslog = None
        hc.errorlog = logging.getLogger("hypercorn.error")
        try:
            await hypercorn_serve(app, hc, shutdown_trigger=self._stop_http.wait,
                                  task_status=task_status)
        finally:
            self._http_done.set()

    async def _stop_serving(self) -> None:
        """Close the listener and let responses being written finish (bounded)."""
        self._stop_http.set()
        with trio.move_on_after(ABORT_GRACE):
            await self._http_done.wait()

    async def _start_actors(self, nursery: trio.Nursery) -> None:
        srv, cfg = self.srv, self.config
        dp = cfg.data_parallel_size
        # --enable-elastic-ep: every core in a process, so that one can join or leave
        in_process = dp == 1 and not cfg.enable_elastic_ep
        log.info("loading the engine" if dp == 1 else f"loading {dp} engine cores")
        cores: list[EngineCore] = [None] * dp  # type: ignore[list-item]

        def rank_config(i: int) -> EngineConfig:
            # --kv-events-config: each engine publishes on its own ports (offset by rank)
            return dataclasses.replace(cfg.engine, extra={**cfg.engine.extra,
                                                          "data_parallel_rank": i})

        async def build(i: int) -> None:
            cores[i] = await trio.to_thread.run_sync(
                self._engine_factory if in_process
                else partial(ProcessEngineCore, rank_config(i)))

        async with trio.open_nursery() as loading:
            for i in range(dp):
                loading.start_soon(build, i)
        core = cores[0]
        info = core.info
        tokenizer = await trio.to_thread.run_sync(load_tokenizer, info.model_dir)
        log.info("engine ready")
        max_seqs = info.max_num_seqs
        capacity = max_seqs + (cfg.max_queued_requests if cfg.max_queued_requests is not None
                               else 2 * max_seqs)
        if not cfg.served_model_names:
            name = Path(cfg.model).stem if cfg.model else DEFAULT_MODEL_NAME
            cfg.served_model_names = [str(name)]
        if in_process:
            system: ActorSystem | DataParallelSystem = await nursery.start(partial(
                run_actor_system, core, tokenizer, capacity=capacity,
                model_name=cfg.served_model_names[0], on_fatal=self._on_fatal,
                admission_window=cfg.admission_window,
                report_timings=cfg.enable_per_request_metrics))
        else:  # each engine holds max_num_seqs; the front end admits for all of them
            most = dp
            if cfg.enable_elastic_ep:
                srv.elastic = elastic_settings(
                    cfg.elastic_ep_max_dp_size, cores, capacity,
                    lambda i: ProcessEngineCore(rank_config(i)))
                most = srv.elastic.max_engines
            system = await nursery.start(partial(
                run_data_parallel, cores, tokenizer, capacity=capacity * dp,
                channel_capacity=capacity * most,
                model_name=cfg.served_model_names[0], on_fatal=self._on_fatal,
                admission_window=cfg.admission_window,
                report_timings=cfg.enable_per_request_metrics))
        srv.actors = system
        srv.tokenizer = tokenizer
        srv.token_texts = system.token_texts
        srv.prompt_bound = system.prompt_bound
        srv.limits = RequestLimits.from_info(info)  # the offline LLM judges by the same numbers
        # generation_config.json's defaults, already named as SamplingParams fields
        srv.defaults = dict(info.generation_defaults)
        srv.renderer = ChatRenderer(
            tokenizer,
            template=load_template_arg(cfg.chat_template),
            content_format=cfg.chat_template_content_format,
            trust_request_template=cfg.trust_request_chat_template,
            default_kwargs=cfg.default_chat_template_kwargs,
            effort_map=cfg.reasoning_effort_map,
        )
        srv.admission = system.admission
        srv.registry = system.registry
        srv.metrics = system.metrics
        srv.model_root = cfg.model or DEFAULT_MODEL_NAME
        srv.kv_event_sources = {i: dict(c.info.kv_event_source) for i, c in enumerate(cores)
                                if c.info.kv_event_source}
        await lora.load_startup_modules(srv)  # --lora-modules, before the first request

    # -- failure and shutdown ----------------------------------------------------------
    def _on_fatal(self, exc: BaseException) -> None:
        self.srv.health.failed = True
        self.exit_code = 1
        self._fatal = exc
        self._fatal_event.set()

    async def _after_failure(self) -> None:
        if self.srv.registry is not None:
            with trio.move_on_after(FAIL_GRACE):
                await self.srv.registry.wait_empty()
        await trio.sleep(0.5)  # handlers that just retired are still writing their error
        await self._stop_serving()

    async def _watch_signals(self, root: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self.srv.health.draining:
                    log.warning("second signal: stopping now")
                    root.cancel_scope.cancel()
                    return
                log.info("%s: draining (up to %.0f s)", signal.Signals(signum).name,
                         self.config.drain_timeout)
                self.srv.health.draining = True
                # Drain in its own task so a second signal can still interrupt it.
                root.start_soon(self._drain, root.cancel_scope)

    async def _drain(self, root_scope: trio.CancelScope) -> None:
        """Shutdown by closure: no new submissions (new requests already get 503), the
        requests in flight finish within the drain timeout (then they are aborted), and the
        actors end on their own as each one's input closes."""
        system = self.srv.actors
        if system is not None:
            system.close_submissions()
            registry = system.registry
            with trio.move_on_after(self.config.drain_timeout):
                await registry.wait_empty()
            if len(registry):
                log.warning("drain timeout: aborting %d requests", len(registry))
                for state in list(registry.requests.values()):
                    system.abort(state)
                with trio.move_on_after(ABORT_GRACE):
                    await registry.wait_empty()
            with trio.move_on_after(ABORT_GRACE):
                await system.stopped.wait()
            if not system.stopped.is_set():
                log.warning("the actors did not stop within %.0f s", ABORT_GRACE)
        await self._stop_serving()
        root_scope.cancel()


def load_tokenizer(model_dir: str) -> Any:
    """The tokenizer (and chat template) of the model the core loaded, from its directory."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    # The routes and the tokenizer actor encode with the Rust tokenizer directly; a
    # tokenizer.json may carry fixed padding and truncation (sentence-transformers' do: pad
    # and cut to 128), which would add pad tokens to every prompt or cut it silently.
    # transformers turns both off for a call that does not ask for them; so do we.
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    return tok


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"time": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: ServerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_json:
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())


def load_refusal(exc: BaseException) -> str | None:
    """The one-line reason when `exc` (or every failure in its group) refuses the model
    itself, files or formats the server cannot serve: an unsupported architecture, a
    missing or unreadable path, a malformed file. None for anything else (a bug)."""
    group = getattr(exc, "exceptions", None)  # an exception group (any Python version)
    if isinstance(group, (list, tuple)):
        leaves = [load_refusal(e) for e in group]
        return leaves[0] if leaves and all(leaves) else None
    if isinstance(exc, (LoadRefused, ValueError, OSError)):
        log.debug("the load was refused", exc_info=exc)  # the traceback, for --log-level debug
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__
    return None


def listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (in use, no such address, not allowed),
    found before the model loads, or None. Binding the same way Hypercorn will then (with
    SO_REUSEADDR) and closing at once leaves nothing behind."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except (OSError, UnicodeError) as exc:
        return getattr(exc, "strerror", None) or str(exc)
    return None


def serve(config: ServerConfig, engine_factory: Callable[[], Any] | None = None) -> int:
    setup_logging(config)
    problem = listen_problem(config.host, config.port)
    if problem is not None:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, problem)
        return 1
    supervisor = Supervisor(config, engine_factory)
    started = time.monotonic()
    try:
        trio.run(supervisor.run)
    except KeyboardInterrupt:
        return 130
    log.info("stopped after %.1f s (exit %d)", time.monotonic() - started, supervisor.exit_code)
    return supervisor.exit_code

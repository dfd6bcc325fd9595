"""WS /v1/realtime: speech to text over a WebSocket, as vLLM 0.34 serves it (and in OpenAI's
realtime transcription events: realtime_protocol), on a Whisper server.

Audio arrives as base64 PCM16 chunks and is cut into the windows an upload of the same
audio gets (server.audio.stream), each transcribed as soon as it is decided, so text
streams while audio still arrives and an item's final text equals the upload route's on
the same samples. A commit (vLLM: `final: true`) ends the item: the rest of its audio is
its last window, and its text and usage follow the last delta.

One connection runs three tasks:

    receive loop ──events──> StreamWindows ──windows──> transcriber ──> engine
         │ (errors as events)                               │ deltas, completed
         └──────────────────────> outbox (bytes bounded) <──┘
                                        │
                                     sender ──> client; a Close ends it

The receive loop never waits on the client's reading: events go to the outbox, bounded
in bytes (a client that reads nothing is closed), and a send that stays blocked past the
stall timeout (server.write_watchdog's, LLMSERVE_STALL_TIMEOUT) resets the socket, as the
HTTP routes drop a client that stopped reading. The bounds (realtime_limits) close only
the connection that passes them; the engine requests of a closed connection are aborted
(leaving transcribe_window aborts its window).

Keys: as every route, behind server.auth (Authorization: Bearer or x-api-key on the
handshake, as vLLM authenticates its WebSocket); a refused handshake is a 401.
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import trio
from quart import Quart, websocket

from server.api.openai import realtime_protocol as proto
from server.api.openai.realtime_items import Item, transcribe
from server.api.openai.realtime_limits import (
    CLIENT_DONE,
    FAILED,
    INTERNAL_ERROR,
    NOT_READY,
    SERVER_FULL,
    AudioBudget,
    Close,
    LeadMeter,
    RealtimeLimits,
    RealtimeMetrics,
)
from server.api.openai.realtime_protocol import OPENAI, VLLM, EventError, Session
from server.audio.mel import SAMPLE_RATE
from server.audio.stream import StreamWindows
from server.errors import APIError, api_error_of_failure
from server.frontend.failures import ServiceFailure
from server.state import ServerState
from server.write_watchdog import reset_connection, reset_socket, stall_timeout

if TYPE_CHECKING:
    from server.audio.prepare import AudioFrontend

log = logging.getLogger("server.realtime")
REALTIME = "/v1/realtime"


class Connection:
    def __init__(self, srv: ServerState, frontend: AudioFrontend, limits: RealtimeLimits,
                 budget: AudioBudget, metrics: RealtimeMetrics, ws: Any) -> None:
        self.srv, self.frontend, self.limits = srv, frontend, limits
        self.budget, self.metrics, self.ws = budget, metrics, ws
        self.session = Session()
        self.windows = StreamWindows()
        self.lead = LeadMeter()
        self.held = 0  # samples received and not yet transcribed (or dropped)
        self.parked: list[np.ndarray] = []  # windows decided before the session names a model
        self.item: Item | None = None
        self.last_item: str | None = None
        self.pending = 0  # work units queued or running
        self.work_send, self.work_recv = trio.open_memory_channel[tuple[str, Item, Any]](
            math.inf)
        self.out_send, self.out_recv = trio.open_memory_channel[str | Close](math.inf)
        self.unsent = 0
        self.closing: Close | None = None
        self.sending_since: float | None = None
        self.window_scope: trio.CancelScope | None = None
        self.window_item: Item | None = None
        self.work_scope = trio.CancelScope()

    # -- lifecycle ---------------------------------------------------------------------
    async def serve(self) -> None:
        await self.ws.accept()
        health = self.srv.health
        if health.loading or health.failed:
            c = NOT_READY if health.loading else FAILED
            await self.ws.close(c.code, c.reason)
            return
        self.metrics.opened(self.srv)
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._sender, outer.cancel_scope)
                outer.start_soon(self._watch_stall, outer.cancel_scope)
                self.emit(proto.session_created(self.session))
                with self.work_scope:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(self._transcriber)
                        await self._receive_loop()
        finally:
            self.budget.give(self.held)
            self.held = 0
            why = (self.closing or CLIENT_DONE).why
            self.metrics.ended(self.srv, why)
            if why != "client":
                log.info("realtime %s closed: %s", self.session.id, self.closing.reason)

    def close(self, c: Close) -> None:
        """Ends the connection: queued events go first, then the close frame."""
        if self.closing is not None:
            return
        self.closing = c
        self.out_send.send_nowait(c)
        self.work_scope.cancel()

    def emit(self, event: dict[str, Any]) -> None:
        if self.closing is not None:
            return
        data = json.dumps(event, ensure_ascii=False)
        if self.unsent + len(data) > self.limits.max_unsent_bytes:
            self.close(self.limits.not_reading())
            return
        self.unsent += len(data)
        self.out_send.send_nowait(data)

    async def _sender(self, done: trio.CancelScope) -> None:
        async for item in self.out_recv:
            self.sending_since = trio.current_time()
            if isinstance(item, Close):
                await self.ws.close(item.code, item.reason)
                break
            await self.ws.send(item)
            self.sending_since = None
            self.unsent -= len(item)
        done.cancel()

    async def _watch_stall(self, done: trio.CancelScope) -> None:
        timeout = stall_timeout()
        while True:
            await trio.sleep(min(1.0, timeout / 4))
            since = self.sending_since
            if since is not None and trio.current_time() - since >= timeout:
                if self.closing is None:
                    self.close(self.limits.not_reading())
                log.warning("realtime %s: the client has not read for %.0f s; resetting",
                            self.session.id, timeout)
                self._reset()
                done.cancel()
                return

    def _reset(self) -> None:
        scope = self.ws.scope
        client, server = tuple(scope.get("client") or ()), tuple(scope.get("server") or ())
        table = self.srv.connections
        sock = table.socket(client, server) if table is not None else None
        if sock is not None:
            reset_socket(sock)
        elif client and server:
            reset_connection(client, server)

    # -- client events -----------------------------------------------------------------
    async def _receive_loop(self) -> None:
        while True:
            with trio.move_on_after(self.limits.idle_timeout) as idle:
                raw = await self.ws.receive()
            if idle.cancelled_caught:
                if self.pending:
                    continue  # its audio is being transcribed: waiting is not idling
                self.close(self.limits.idle())
                return
            event: dict[str, Any] = {}
            try:
                event = proto.parse_event(raw)
                self.handle(event)
            except EventError as exc:
                self.emit(proto.error(self.session.dialect, exc,
                                      proto.client_event_id(event)))

    def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("session.update", "transcription_session.update"):
            if "session" in event:
                self.session.dialect = OPENAI
            self.update_session(proto.parse_session_update(event))
        elif kind == "input_audio_buffer.append":
            self.append(proto.decode_audio(event, self.limits.max_chunk_bytes))
        elif kind == "input_audio_buffer.commit":
            self.commit(event.get("final") is True)
        elif kind == "input_audio_buffer.clear":
            self.clear()
        else:
            raise proto.unknown_event(kind)

    def update_session(self, upd: proto.SessionUpdate) -> None:
        from server.frontend.transcription import whisper_tokens

        if upd.dialect == VLLM and upd.model is None:
            raise EventError("Missing required field: model", "invalid_event", "model")
        model = upd.model or self.srv.model_name
        if model not in self.srv.config.served_model_names:
            raise EventError(f"The model `{model[:200]}` does not exist.", "model_not_found",
                             "model")
        toks = whisper_tokens(self.srv)
        language = self.session.language if upd.language is None else upd.language or None
        if language is not None and (
                (toks.multilingual and language not in toks.languages)
                or (not toks.multilingual and language != "en")):
            raise EventError(f"Unsupported language {language[:20]!r} for this model",
                             "invalid_language", "language")
        first = self.session.model is None
        self.session = replace(self.session, dialect=upd.dialect, model=model,
                               language=language,
                               prompt=self.session.prompt if upd.prompt is None else upd.prompt)
        self.emit(proto.session_updated(self.session))
        if first:
            parked, self.parked = self.parked, []
            for w in parked:
                self._queue("window", self._current_item(), w)

    def append(self, samples: np.ndarray) -> None:
        n = samples.shape[0]
        if self.lead.add(trio.current_time(), n / SAMPLE_RATE) > self.limits.max_lead_s:
            self.close(self.limits.too_fast())
        elif self.held + n > self.limits.max_buffer_samples:
            self.close(self.limits.buffer_full())
        elif not self.budget.take(n):
            self.close(SERVER_FULL)
        else:
            self.held += n
            for w in self.windows.append(samples):
                self._window(w)

    def commit(self, final: bool) -> None:
        if self.session.model is None:
            raise EventError("Model not validated. Make sure to validate the model by "
                             "sending a session.update event.", "model_not_validated")
        if self.session.dialect == VLLM and not final:
            return  # vLLM's "start": transcription already runs as audio arrives
        last = self.windows.finish()
        if self.session.dialect == OPENAI and self.item is None and last is None:
            raise EventError("Error committing input audio buffer: the buffer is empty.",
                             "input_audio_buffer_commit_empty")
        if last is not None:
            self._window(last)
        item = self._current_item()
        self.item = None
        if self.session.dialect == OPENAI:
            self.emit(proto.committed(item.id, item.previous))
        self._queue("end", item, None)

    def clear(self) -> None:
        last = self.windows.finish()
        dropped = sum(w.shape[0] for w in self.parked) + (0 if last is None else last.shape[0])
        self.parked = []
        self._release(dropped)
        if self.item is not None:
            self.item.dropped = True
            if self.window_scope is not None and self.window_item is self.item:
                self.window_scope.cancel()  # its window being transcribed
            self.item = None
        self.emit(proto.cleared())

    def _window(self, samples: np.ndarray) -> None:
        if self.session.model is None:
            self.parked.append(samples)
        else:
            self._queue("window", self._current_item(), samples)

    def _current_item(self) -> Item:
        if self.item is None:
            self.item = Item(proto.new_id("item_"), self.last_item, self.session.language,
                             self.session.prompt)
            self.last_item = self.item.id
        return self.item

    def _queue(self, kind: str, item: Item, samples: np.ndarray | None) -> None:
        self.pending += 1
        self.work_send.send_nowait((kind, item, samples))

    def _release(self, samples: int) -> None:
        self.held -= samples
        self.budget.give(samples)

    # -- transcription -----------------------------------------------------------------
    async def _transcriber(self) -> None:
        async for kind, item, samples in self.work_recv:
            try:
                if kind == "end":
                    if not item.dropped:
                        self.emit(proto.completed(self.session.dialect, item.id, item.text,
                                                  item.prompt_tokens, item.completion_tokens))
                    continue
                if not item.dropped:
                    self.window_item = item
                    with trio.CancelScope() as self.window_scope:
                        await self._transcribe(item, samples)
            except (APIError, ServiceFailure) as exc:
                error = api_error_of_failure(exc) if isinstance(exc, ServiceFailure) else exc
                self.emit(proto.error(self.session.dialect,
                                      EventError(error.message, "processing_error")))
            except Exception:
                log.exception("realtime %s: transcription failed", self.session.id)
                self.emit(proto.error(self.session.dialect,
                                      EventError("transcription failed", "processing_error")))
                self.close(INTERNAL_ERROR)
            finally:
                self.window_scope = None
                self.pending -= 1
                if samples is not None:
                    self._release(samples.shape[0])

    async def _transcribe(self, item: Item, samples: np.ndarray) -> None:
        async with aclosing(transcribe(self.srv, self.frontend, self.session, item,
                                       samples)) as texts:
            async for text in texts:
                self.emit(proto.delta(self.session.dialect, item.id, text))


def register(app: Quart, srv: ServerState, frontend: AudioFrontend) -> None:
    """Mounted beside the audio routes (a Whisper model only)."""
    limits = RealtimeLimits.of(srv.config)
    budget = AudioBudget(srv.config.realtime_max_total_buffer_bytes)
    metrics = RealtimeMetrics()

    @app.websocket(REALTIME)
    async def v1_realtime() -> None:
        ws = websocket._get_current_object()  # type: ignore[attr-defined]
        await Connection(srv, frontend, limits, budget, metrics, ws).serve()

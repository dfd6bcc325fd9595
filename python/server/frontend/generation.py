"""One generation request's life at the HTTP edge: admit, submit, read, retire.

    admit (slots or 400/503) -> submit to the tokenizer -> wait until the prompt is ready
        (or its 400) -> read the Outbox ... -> retire: abort what still runs

The admission slots go back as soon as every sequence has retired in the engine, whether or
not the handler has written the output yet: a client that stops reading keeps its own
response in memory, but never the capacity other requests need. The registry entry (what
/load and the drain count) stays until the handler retires the request.

`retire` never awaits: it runs in `finally` of a handler that may be cancelled because the
client went away, and the wait for retirement happens in a reaper task of the server.

The handler's own `finally` is not enough: a streamed response's `finally` lives in its body
generator, which never runs if the client goes away before the body is first iterated (while
the response head is written). So every Generation that reached the tokenizer is also noted
on the request being served, and `RetireAtRequestEnd`, an ASGI middleware, retires them when
that request ends, however it ends (`retire` is idempotent).
"""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

import trio

from actors.errors import RequestRefused
from actors.params.encoder import EncoderInput
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams
from actors.runtime.failures import Outcome
from actors.runtime.outbox import Outbox, OutboxFailed
from actors.runtime.request import PromptInput, RequestState
from server.errors import (
    APIError, api_error_of, bad_request, overloaded, prefill_backlog_full, status_of,
)
from server.state import ServerState
from server.write_watchdog import track_output

log = logging.getLogger("server.requests")

RETIRE_TIMEOUT = 30.0

# The Generations started while serving the current ASGI request (set by RetireAtRequestEnd).
_request_generations: contextvars.ContextVar[list[Generation] | None] = contextvars.ContextVar(
    "llmserve_request_generations", default=None)


def detach_from_request() -> None:
    """Generations this task starts from now on outlive the HTTP request it serves (the
    Responses API's background mode): RetireAtRequestEnd leaves them running, and the task
    that reads them retires them."""
    _request_generations.set(None)


def new_request_id(header: str | None, body: str | None) -> str:
    if header:
        return header[:128]
    if body:
        return body
    return uuid.uuid4().hex


def request_names(ids: list[str]) -> list[str]:
    """The ids an operator's abort names, as the runtime matches them (a request's internal
    id or the client's id before it): each id as given, and the client's id inside the
    response ids built from it (cmpl-{id}, chatcmpl-{id})."""
    names = []
    for name in ids:
        names.append(name)
        for prefix in ("chatcmpl-", "cmpl-"):
            if name.startswith(prefix):
                names.append(name[len(prefix):])
    return names


class Generation:
    """Context manager around one admitted request."""

    def __init__(self, srv: ServerState, request_id: str, prompts: list[PromptInput],
                 params: SamplingParams, pooling: PoolingSpec | None = None,
                 encoder_input: EncoderInput | None = None) -> None:
        """``pooling``: a pooling request (embeddings), answered by one vector per prompt
        (ChoiceUpdate.pooled) instead of tokens. ``encoder_input``: a transcription
        request (one prompt: the decoder's tokens for this audio window)."""
        self.srv = srv
        self.slots = len(prompts) * params.n
        # Internal ids are ours: a client-chosen X-Request-Id never keys shared state.
        self.state = RequestState(
            f"{request_id}.{uuid.uuid4().hex[:8]}",
            [_typed_render(p) for p in prompts],
            params,
            max_model_len=srv.limits.max_model_len,  # type: ignore[union-attr]
            outbox=HTTPOutbox(len(prompts) * params.n),
            pooling=pooling,
            encoder_input=encoder_input,
        )
        track_output(self.state.outbox)  # what a slow reader leaves unread counts against it
        self.public_id = request_id
        self.created = int(time.time())
        self._retired = False
        self._slots_held = False
        self._registered = False

    async def start(self) -> None:
        """Admit and wait until the prompt is tokenized. Raises APIError (503, 400...)."""
        srv = self.srv
        if not srv.health.serving:
            raise APIError(503, "The server is not accepting requests now.",
                           headers={"Retry-After": "5"})
        paused = srv.actors.refusal()  # type: ignore[union-attr]
        if paused is not None:
            # /pause (abort or wait): refused before any response starts, as the engine
            # refuses an admit that was already on its way.
            raise api_error_of(paused)
        capacity = srv.admission.capacity  # type: ignore[union-attr]
        if self.slots > capacity:
            # Waiting cannot help: the server could not hold this request even when idle.
            raise bad_request(
                f"this request needs {self.slots} sequences (prompts x n) but the server "
                f"runs at most {capacity} at once", "n",
            )
        if not srv.admission.try_acquire(self.slots):  # type: ignore[union-attr]
            if srv.metrics is not None:
                srv.metrics.count_rejection("max_num_queued_reqs")
            raise overloaded()
        self._slots_held = True
        backlog = srv.config.max_num_queued_tokens
        if backlog is not None and srv.actors.queued_prompt_tokens >= backlog:  # type: ignore[union-attr]
            self._release_slots()
            if srv.metrics is not None:
                srv.metrics.count_rejection("max_num_queued_tokens")
            raise prefill_backlog_full()
        try:
            srv.registry.add(self.state)  # type: ignore[union-attr]
        except RequestRefused as exc:
            self._release_slots()
            raise api_error_of(exc) from None
        except Exception:
            self._release_slots()
            raise
        self._registered = True
        try:
            await srv.actors.submit(self.state)  # type: ignore[union-attr]
        except trio.ClosedResourceError:  # the drain closed submissions meanwhile
            self.state.retired.set()
            self.retire()
            raise APIError(503, "The server is not accepting requests now.",
                           headers={"Retry-After": "5"}) from None
        except BaseException:
            self.state.retired.set()  # never reached the tokenizer: nothing else holds it
            self.retire()
            raise
        # From here on retire() is what ends it, whoever calls it: the request owns it too.
        owned = _request_generations.get()
        if owned is not None:
            owned.append(self)
        if srv.reaper is not None:
            srv.reaper.start_soon(self._release_slots_when_retired)
        try:
            await self.state.ready.wait()
        except BaseException:
            self.retire()
            raise
        if self.state.error is not None:
            err = self.state.error
            self.retire()
            raise api_error_of(err)

    def retire(self) -> None:
        """Abort whatever still runs and hand the slots back once everything retired."""
        if self._retired:
            return
        self._retired = True
        state = self.state
        state.outbox.close()  # nobody reads it any more: the abort below adds nothing to it
        if self.srv.actors is not None:
            self.srv.actors.abort(state)
        else:
            state.cancelled = True
        if state.retired.is_set() or self.srv.reaper is None:
            self._release()
        else:
            self.srv.reaper.start_soon(self._release_when_retired)

    async def _release_when_retired(self) -> None:
        with trio.move_on_after(RETIRE_TIMEOUT) as scope:
            await self.state.retired.wait()
        if scope.cancelled_caught:
            log.error("request %s did not retire in %.0f s", self.state.request_id, RETIRE_TIMEOUT)
        self._release()

    async def _release_slots_when_retired(self) -> None:
        """No timeout: a request legitimately holds its slots for as long as it generates."""
        await self.state.retired.wait()
        self._release_slots()

    def _release(self) -> None:
        if self._registered:
            self._registered = False
            self.srv.registry.remove(self.state)  # type: ignore[union-attr]
        self._release_slots()

    def _release_slots(self) -> None:
        """Idempotent: the reaper and the handler's retire may both get here."""
        if self._slots_held:
            self._slots_held = False
            self.srv.admission.release(self.slots)  # type: ignore[union-attr]


class HTTPOutboxFailed(OutboxFailed):
    """OutboxFailed with the HTTP status of its reason, for the routes that read `status`."""

    def __init__(self, error: Outcome) -> None:
        super().__init__(error)
        self.status = status_of(error)


class HTTPOutbox(Outbox):
    """The Outbox of a request served over HTTP: a failure it raises carries its status."""

    def _failed(self, error: Outcome) -> OutboxFailed:
        return HTTPOutboxFailed(error)


def _typed_render(prompt: PromptInput) -> PromptInput:
    """A chat template refuses a request with an APIError (always a 400); the engine side
    knows only typed refusals, so the render it calls raises RequestRefused instead."""
    render = prompt.render
    if render is None:
        return prompt

    def typed() -> str:
        try:
            return render()
        except APIError as exc:
            if 400 <= exc.status < 500:
                raise RequestRefused(exc.message, exc.param) from None
            raise

    return replace(prompt, render=typed)


class RetireAtRequestEnd:
    """ASGI middleware: retire every Generation started while serving a request when the
    request ends (response written, client gone, cancelled or failed)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        owned: list[Generation] = []
        token = _request_generations.set(owned)
        try:
            await self.app(scope, receive, send)
        finally:
            _request_generations.reset(token)
            for gen in owned:
                try:
                    gen.retire()
                except Exception:  # one failure must not keep the others running
                    log.exception("retiring request %s failed", gen.state.request_id)

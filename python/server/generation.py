"""One generation request's life at the HTTP edge: admit, submit, read, retire.

    admit (slots or 503) -> submit to the tokenizer -> wait until the prompt is ready
        (or its 400) -> read the Outbox ... -> retire: abort what still runs, and once every
        sequence has retired, release the slots

`retire` never awaits: it runs in `finally` of a handler that may be cancelled because the
client went away, and the wait for retirement happens in a reaper task of the server.
"""

from __future__ import annotations

import logging
import time
import uuid

import trio

from actors.sampling_params import SamplingParams
from actors.runtime.request import PromptInput, RequestState
from server.errors import APIError, overloaded
from server.state import ServerState

log = logging.getLogger("server.requests")

RETIRE_TIMEOUT = 30.0


def new_request_id(header: str | None, body: str | None) -> str:
    if header:
        return header[:128]
    if body:
        return body
    return uuid.uuid4().hex


class Generation:
    """Context manager around one admitted request."""

    def __init__(self, srv: ServerState, request_id: str, prompts: list[PromptInput],
                 params: SamplingParams) -> None:
        self.srv = srv
        self.slots = len(prompts) * params.n
        # Internal ids are ours: a client-chosen X-Request-Id never keys shared state.
        self.state = RequestState(
            f"{request_id}.{uuid.uuid4().hex[:8]}",
            prompts,
            params,
            max_model_len=srv.limits.max_model_len,  # type: ignore[union-attr]
        )
        self.public_id = request_id
        self.created = int(time.time())
        self._retired = False

    async def start(self) -> None:
        """Admit and wait until the prompt is tokenized. Raises APIError (503, 400...)."""
        srv = self.srv
        if not srv.health.serving:
            raise APIError(503, "The server is not accepting requests now.",
                           headers={"Retry-After": "5"})
        if not srv.admission.try_acquire(self.slots):  # type: ignore[union-attr]
            raise overloaded()
        try:
            srv.registry.add(self.state)  # type: ignore[union-attr]
        except Exception:
            srv.admission.release(self.slots)  # type: ignore[union-attr]
            raise
        try:
            await srv.submit_send.send(self.state)  # type: ignore[union-attr]
        except BaseException:
            self.state.retired.set()  # never reached the tokenizer: nothing else holds it
            self.retire()
            raise
        try:
            await self.state.ready.wait()
        except BaseException:
            self.retire()
            raise
        if self.state.error is not None:
            err = self.state.error
            self.retire()
            raise APIError(err.status, err.message, param=err.param)

    def retire(self) -> None:
        """Abort whatever still runs and hand the slots back once everything retired."""
        if self._retired:
            return
        self._retired = True
        state = self.state
        state.cancelled = True
        scheduler = self.srv.scheduler
        for child in state.children:
            if not child.retired and scheduler is not None:
                scheduler.abort_nowait(child)
        state.outbox.close()
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

    def _release(self) -> None:
        self.srv.registry.remove(self.state)  # type: ignore[union-attr]
        self.srv.admission.release(self.slots)  # type: ignore[union-attr]

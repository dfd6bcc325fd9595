"""Background responses (`background: true`) and their cancel.

The POST admits the generation (so 400s and 503s still answer it), stores it `in_progress`
and returns; a task in the server's nursery, not the request's, reads it to the end and
stores the final state. Cancel stops that task, whose generation is then retired (aborted
in the engine, its KV blocks freed) and stores it `cancelled`.

Several servers may share one store file (replicas on one machine). Cancel of a response
another server runs asks it through the row: while a server runs background responses it
polls the store for the cancels asked of its rows, cancels, stores `cancelled`; the asking
server waits for that state and returns it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from server.api.openai.responses_render import (
    OutputBuilder,
    ResponseShape,
    failed_body,
    final_body,
)
from server.errors import bad_request
from server.frontend.failures import ServiceFailure
from server.frontend.responses_store import UNFINISHED, ResponseStore
from server.frontend.service import TextGeneration
from server.state import ServerState

log = logging.getLogger("server.responses")

CANCEL_POLL = 0.2  # seconds between looks for cancels asked through the store
CANCEL_WAIT = 30.0  # seconds a cancel waits for the server that runs the response
CLOSE_WAIT = 2.0  # seconds the store's close at shutdown waits for the last states
_CANNOT_CANCEL = "Cannot cancel a synchronous response."


@dataclass
class _Job:
    gen: TextGeneration
    shape: ResponseShape
    builder: OutputBuilder
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    final: dict[str, Any] | None = None


class BackgroundResponses:
    """The background responses this server runs, over the store they are kept in."""

    def __init__(self, srv: ServerState, store: ResponseStore) -> None:
        self.srv = srv
        self.store = store
        self.jobs: dict[str, _Job] = {}
        self._watch: trio.CancelScope | None = None  # the task polling for cancels, if any

    async def start(self, gen: TextGeneration, shape: ResponseShape, builder: OutputBuilder,
                    turn: list[dict[str, Any]], client: str) -> dict[str, Any]:
        """Stores the response `in_progress` and runs it in the server's nursery; returns
        the stored body."""
        reaper = self.srv.reaper
        assert reaper is not None
        job = _Job(gen, shape, builder)
        body = shape.body("in_progress", [])
        self.jobs[shape.id] = job
        try:
            await self.store.put(body, turn, client)
        except BaseException:
            self.jobs.pop(shape.id, None)
            gen.retire()
            raise
        reaper.start_soon(self._run, job)
        if self._watch is None:
            self._watch = trio.CancelScope()
            reaper.start_soon(self._watch_cancels, self._watch)
        return body

    async def _run(self, job: _Job) -> None:
        """Reads the generation to its end (or its cancel) and stores the final state. It
        runs in the server's nursery: nothing it raises may escape."""
        try:
            with job.scope:
                try:
                    result = await job.gen.collect()
                    choice = result.choices[0]
                    job.builder.feed_whole(choice)
                    job.final = final_body(job.shape, job.builder, result.usage,
                                           choice.finish_reason, choice.timing)
                except ServiceFailure as exc:
                    job.final = failed_body(job.shape, job.builder, exc.message)
            if job.scope.cancelled_caught:
                job.final = job.shape.body("cancelled", [])
            if job.final is not None and not await self.store.update(job.final):
                log.info("background response %s was evicted before it finished", job.shape.id)
        except Exception:
            log.exception("background response %s failed", job.shape.id)
        finally:
            job.gen.retire()
            self.jobs.pop(job.shape.id, None)
            job.done.set()

    async def _watch_cancels(self, scope: trio.CancelScope) -> None:
        """While background responses run here, carries out the cancels other servers on
        the same store file ask for through their rows. Runs in the server's nursery."""
        try:
            with scope:
                while self.jobs:
                    await trio.sleep(CANCEL_POLL)
                    try:
                        asked = await self.store.cancel_requests()
                    except Exception:
                        log.exception("reading the store's cancel requests failed")
                        continue
                    for rid in asked:
                        job = self.jobs.get(rid)
                        if job is not None:
                            job.scope.cancel()
        finally:
            self._watch = None

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Cancels the response, run here or by another server on the store file, and
        returns its last state; None when the store has no such response, a 400 when
        nothing runs it."""
        job = self.jobs.get(response_id)
        if job is not None:
            job.scope.cancel()
            await job.done.wait()
            assert job.final is not None
            return job.final
        stored = await self.store.get(response_id)
        if stored is None:
            return None
        if not await self.store.request_cancel(response_id):
            raise bad_request(_CANNOT_CANCEL, "response_id")
        # Another server on this store file runs it: wait for the state it stores.
        with trio.move_on_after(CANCEL_WAIT):
            while stored is not None and stored.status in UNFINISHED:
                await trio.sleep(CANCEL_POLL / 2)
                stored = await self.store.get(response_id)
        return None if stored is None else stored.body

    async def close(self) -> None:
        """At shutdown: once the background responses have stored their last state (a
        short wait: after a drain their generations have ended), closes the store, which
        fails the rows of any still running and removes this server's lock file."""
        with trio.move_on_after(CLOSE_WAIT):
            for job in list(self.jobs.values()):
                await job.done.wait()
        if self._watch is not None:
            self._watch.cancel()
        await self.store.close()

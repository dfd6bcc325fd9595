"""The scheduler actor: feeds admitted sequences and aborts to the engine, step by step.

    tokenizer --EngineRequest (admit channel)--> scheduler --TokenBatch (batch channel)--> tokenizer
    HTTP / tokenizer --abort_nowait()--> scheduler (a set, never blocks)

The engine is mutated (add, abort) only here and only between steps. The tokenizer <->
scheduler cycle has one edge that never blocks: the batch channel is written with
`send_nowait` only after taking a credit that the tokenizer returns once it has processed
a batch, so at most BATCH_CREDITS batches exist and the channel (of that size) is never
full. Shutdown needs no sentinel: the admit channel closes when the tokenizer's submit loop
ends; the scheduler then finishes what the engine holds and closes the batch channel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from actors.messages import Abort, Admit, TokenBatch
from actors.runtime import faults
from actors.runtime.engine_actor import EngineActor, EngineFailed
from actors.runtime.metric_events import (
    EngineStats,
    GroupFinished,
    MetricEvent,
    SequenceFinished,
    StepTokens,
)
from actors.runtime.request import Choice, EngineRequest, Registry

log = logging.getLogger("server.scheduler")

# Engine steps whose outputs may wait for detokenization at once: one being detokenized
# while the next runs keeps the engine busy without letting the tokenizer fall behind.
BATCH_CREDITS = 2


class SchedulerActor:
    def __init__(
        self,
        engine: EngineActor,
        registry: Registry,
        admit_recv: trio.MemoryReceiveChannel[EngineRequest],
        batch_send: trio.MemorySendChannel[list[Any]],
        metrics_send: trio.MemorySendChannel[MetricEvent],
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._on_fatal = on_fatal
        self._engine = engine
        self._registry = registry
        self._admit_recv = admit_recv
        self._batch_send = batch_send
        self._metrics_send = metrics_send
        self.credits = trio.Semaphore(BATCH_CREDITS)
        # Admitted requests not yet handed to the engine. Bounded by admission capacity:
        # each choice holds a slot that is not returned before it retires.
        self._admitted: list[EngineRequest] = []
        # (request, choice index or None: all of them); at most one entry per live choice
        # and one per live request, so bounded the same way.
        self._aborts: list[tuple[EngineRequest, int | None]] = []
        self._wakeup = trio.Event()
        self._admit_closed = False
        self._last_stats: EngineStats | None = None
        self.metrics_dropped = 0

    # -- called from other actors in the same thread; never blocks ------------------
    def abort_nowait(self, req: EngineRequest, index: int | None = None) -> None:
        """Stops every choice of `req`, or only choice `index` (a stop string matched)."""
        if index is None:
            if req.done or req.abort_requested:
                return
            req.abort_requested = True
        else:
            choice = req.choices[index]
            if choice.retired or choice.abort_requested:
                return
            choice.abort_requested = True
        self._aborts.append((req, index))
        self._wakeup.set()

    def _fail_everything(self) -> None:
        """After an engine failure: fail and retire everything without touching the engine."""
        for state in list(self._registry.requests.values()):
            state.outbox.fail(500, "the engine failed while serving this request")
        for _state, req in list(self._registry.engine_requests.values()):
            self._retire_all(req, "error")
        for req in self._admitted:
            self._retire_all(req, "error")
        self._admitted.clear()

    # -- the actor -------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        async with self._batch_send, trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_admits)
            task_status.started()
            try:
                await self._loop()
            except EngineFailed as exc:
                log.error("%s; failing every in-flight request", exc)
                self._fail_everything()
                self._on_fatal(exc)
                await trio.sleep_forever()  # the supervisor decides when the process ends
            nursery.cancel_scope.cancel()

    async def _receive_admits(self) -> None:
        async with self._admit_recv:
            async for req in self._admit_recv:
                self._admitted.append(req)
                self._wakeup.set()
        self._admit_closed = True
        self._wakeup.set()

    async def _loop(self) -> None:
        engine = self._engine.engine
        while True:
            self._apply_aborts(engine)
            self._apply_admits(engine)
            self._publish_stats(engine)
            if not engine.has_unfinished_requests():
                if self._admit_closed and not self._admitted:
                    return
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            await self.credits.acquire()
            started = time.monotonic()
            batch = await self._engine.step()
            outputs = list(batch.outputs)
            self._note_schedule(batch, started)
            self._account(outputs)
            self._batch_send.send_nowait(outputs)  # never raises WouldBlock: see credits
            faults.check("scheduler")

    def _apply_admits(self, engine: Any) -> None:
        admitted, self._admitted = self._admitted, []
        for req in admitted:
            if req.abort_requested or req.done:
                self._retire_all(req, "abort")
                continue
            try:
                engine.add(Admit(req.engine_id, tuple(req.prompt_token_ids), req.params,
                                 arrival_time=req.admitted_at, priority=req.params.priority))
            except ValueError as exc:  # the engine's own checks; the edge should catch these
                log.warning("engine refused %s: %s", req.engine_id, exc)
                found = self._registry.engine_requests.get(req.engine_id)
                if found is not None:
                    found[0].outbox.fail(400, "the request was refused by the engine")
                self._retire_all(req, "error")
                continue
            req.in_engine = True

    def _apply_aborts(self, engine: Any) -> None:
        aborts, self._aborts = self._aborts, []
        for req, index in aborts:
            if not req.in_engine or req.done:
                continue  # its Admit has not been applied yet (it retires there) or it is gone
            engine.abort(Abort(req.engine_id, index))
            # The core reports nothing for what it aborts: those choices retire here.
            for choice in req.live_choices() if index is None else [req.choices[index]]:
                self._retire(req, choice, choice.finish_reason or "abort")

    def _note_schedule(self, batch: TokenBatch, started: float) -> None:
        """From the step just run: preemptions per choice, and when each newly admitted
        request was first scheduled (its queue time ends there, although a long prompt's
        first token comes several chunked steps later; the forked choices start with it)."""
        for engine_id, index in batch.preempted:
            choice = self._choice(engine_id, index)
            if choice is not None:
                choice.num_preemptions += 1
        for engine_id, index in batch.scheduled:
            found = self._registry.engine_requests.get(engine_id)
            if found is None:
                continue
            for choice in found[1].choices if index == 0 else [found[1].choices[index]]:
                if choice.scheduled_at is None:
                    choice.scheduled_at = started

    def _choice(self, engine_id: str, index: int) -> Choice | None:
        found = self._registry.engine_requests.get(engine_id)
        if found is None or not 0 <= index < len(found[1].choices):
            return None
        return found[1].choices[index]

    def _account(self, outputs: list[Any]) -> None:
        now = time.monotonic()
        prompt = cached = generated = 0
        for out in outputs:
            found = self._registry.engine_requests.get(out.request_id)
            if found is None:
                continue
            req = found[1]
            choice = req.choices[out.index]
            if choice.retired:
                continue
            choice.num_cached_tokens = out.num_cached_tokens
            if out.new_token_ids:
                if not req.prompt_counted:  # the prompt ran once, for all its choices
                    req.prompt_counted = True
                    prompt += len(req.prompt_token_ids)
                    cached += out.num_cached_tokens
                if choice.first_token_at is None:
                    choice.first_token_at = now
                elif choice.last_token_at is not None:
                    choice.inter_token.append(now - choice.last_token_at)
                choice.last_token_at = now
                choice.num_generated += len(out.new_token_ids)
                generated += len(out.new_token_ids)
            if out.finished:
                self._retire(req, choice, out.finish_reason or "stop")
        self._emit(StepTokens(prompt, cached, generated))

    def _retire_all(self, req: EngineRequest, reason: str) -> None:
        for choice in req.live_choices():
            self._retire(req, choice, choice.finish_reason or reason)

    def _retire(self, req: EngineRequest, choice: Choice, reason: str) -> None:
        if choice.retired:
            return
        choice.retired = True
        if choice.finish_reason is None:
            choice.finish_reason = reason
        self._emit(_finished(req, choice, time.monotonic()))
        if req.live_choices():
            return
        req.done = True
        req.in_engine = False
        self._emit(GroupFinished(len(req.choices), max(c.num_generated for c in req.choices)))
        found = self._registry.engine_requests.get(req.engine_id)
        if found is not None:
            found[0].note_retired()

    def _publish_stats(self, engine: Any) -> None:
        stats = engine.stats()
        if stats != self._last_stats:
            self._last_stats = stats
            self._emit(stats)

    def _emit(self, event: MetricEvent) -> None:
        try:
            self._metrics_send.send_nowait(event)
        except trio.WouldBlock:
            self.metrics_dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


def _finished(req: EngineRequest, choice: Choice, now: float) -> SequenceFinished:
    scheduled, first, last = choice.scheduled_at, choice.first_token_at, choice.last_token_at
    started = scheduled is not None and first is not None and last is not None
    return SequenceFinished(
        finish_reason=choice.finish_reason or "error",
        num_prompt_tokens=len(req.prompt_token_ids),
        num_generation_tokens=choice.num_generated,
        num_cached_tokens=choice.num_cached_tokens,
        num_preemptions=choice.num_preemptions,
        max_tokens=req.params.max_tokens,
        e2e_seconds=now - req.admitted_at,
        queue_seconds=None if scheduled is None else scheduled - req.admitted_at,
        ttft_seconds=None if first is None else first - req.admitted_at,
        inter_token_seconds=tuple(choice.inter_token),
        prefill_seconds=first - scheduled if started else None,  # type: ignore[operator]
        decode_seconds=last - first if started else None,  # type: ignore[operator]
        inference_seconds=last - scheduled if started else None,  # type: ignore[operator]
    )

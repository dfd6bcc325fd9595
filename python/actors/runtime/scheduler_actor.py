"""The scheduler actor: feeds admitted sequences and aborts to the engine, step by step.

    tokenizer --Child (admit channel)--> scheduler --TokenBatch (batch channel)--> tokenizer
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

from actors.messages import TokenBatch
from actors.runtime import faults
from actors.runtime.engine_actor import EngineActor, EngineFailed
from actors.runtime.metric_events import (
    EngineStats,
    GroupFinished,
    MetricEvent,
    SequenceFinished,
    StepTokens,
)
from actors.runtime.request import Child, Registry

log = logging.getLogger("server.scheduler")

# Engine steps whose outputs may wait for detokenization at once: one being detokenized
# while the next runs keeps the engine busy without letting the tokenizer fall behind.
BATCH_CREDITS = 2


class SchedulerActor:
    def __init__(
        self,
        engine: EngineActor,
        registry: Registry,
        admit_recv: trio.MemoryReceiveChannel[Child],
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
        # Admitted children not yet handed to the engine. Bounded by admission capacity:
        # each holds a slot that is not returned before it retires.
        self._admitted: list[Child] = []
        self._aborts: list[Child] = []  # bounded the same way: one entry per live child
        self._wakeup = trio.Event()
        self._admit_closed = False
        self._last_stats: EngineStats | None = None
        self.metrics_dropped = 0

    # -- called from other actors in the same thread; never blocks ------------------
    def abort_nowait(self, child: Child) -> None:
        if child.retired or child.abort_requested:
            return
        child.abort_requested = True
        self._aborts.append(child)
        self._wakeup.set()

    def _fail_everything(self) -> None:
        """After an engine failure: fail and retire everything without touching the engine."""
        for state in list(self._registry.requests.values()):
            state.outbox.fail(500, "the engine failed while serving this request")
        for _state, child in list(self._registry.children.values()):
            child.in_engine = False
            self._retire(child, "error")
        for child in self._admitted:
            self._retire(child, "error")
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
            async for child in self._admit_recv:
                self._admitted.append(child)
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
        for child in admitted:
            if child.abort_requested or child.retired:
                self._retire(child, child.finish_reason or "abort")
                continue
            try:
                engine.add_request(
                    child.engine_id,
                    child.prompt_token_ids,
                    child.params,
                    priority=child.params.priority,
                )
            except ValueError as exc:  # the engine's own checks; the edge should catch these
                log.warning("engine refused %s: %s", child.engine_id, exc)
                found = self._registry.children.get(child.engine_id)
                if found is not None:
                    found[0].outbox.fail(400, "the request was refused by the engine")
                self._retire(child, "error")
                continue
            child.in_engine = True

    def _apply_aborts(self, engine: Any) -> None:
        aborts, self._aborts = self._aborts, []
        for child in aborts:
            if child.in_engine and not child.retired:
                engine.abort_request(child.engine_id)
                child.in_engine = False
                self._retire(child, child.finish_reason or "abort")
            # Otherwise its Admit has not arrived yet (it is retired then) or it is gone.

    def _note_schedule(self, batch: TokenBatch, started: float) -> None:
        """From the step just run (engine id = child id): preemptions per sequence, and
        when each newly admitted sequence was first scheduled (its queue time ends there,
        although a long prompt's first token comes several chunked steps later)."""
        for engine_id, _index in batch.preempted:
            found = self._registry.children.get(engine_id)
            if found is not None:
                found[1].num_preemptions += 1
        for engine_id, _index in batch.scheduled:
            found = self._registry.children.get(engine_id)
            if found is not None and found[1].scheduled_at is None:
                found[1].scheduled_at = started

    def _account(self, outputs: list[Any]) -> None:
        now = time.monotonic()
        prompt = cached = generated = 0
        for out in outputs:
            found = self._registry.children.get(out.request_id)
            if found is None:
                continue
            _state, child = found
            if child.retired:
                continue
            child.num_cached_tokens = getattr(out, "num_cached_tokens", 0)
            if out.new_token_ids:
                if child.first_token_at is None:
                    child.first_token_at = now
                    prompt += len(child.prompt_token_ids)
                    cached += child.num_cached_tokens
                elif child.last_token_at is not None:
                    child.inter_token.append(now - child.last_token_at)
                child.last_token_at = now
                child.num_generated += len(out.new_token_ids)
                generated += len(out.new_token_ids)
            if out.finished:
                child.in_engine = False
                self._retire(child, out.finish_reason or "stop")
        self._emit(StepTokens(prompt, cached, generated))

    def _retire(self, child: Child, reason: str) -> None:
        if child.retired:
            return
        child.retired = True
        if child.finish_reason is None:
            child.finish_reason = reason
        state_child = self._registry.children.get(child.engine_id)
        self._emit(_finished(child, time.monotonic()))
        if state_child is not None:
            state = state_child[0]
            group = [c for c in state.children if c.prompt_index == child.prompt_index]
            if all(c.retired for c in group):
                self._emit(GroupFinished(len(group), max(c.num_generated for c in group)))
            state.note_retired()

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


def _finished(child: Child, now: float) -> SequenceFinished:
    scheduled, first, last = child.scheduled_at, child.first_token_at, child.last_token_at
    started = scheduled is not None and first is not None and last is not None
    return SequenceFinished(
        finish_reason=child.finish_reason or "error",
        num_prompt_tokens=len(child.prompt_token_ids),
        num_generation_tokens=child.num_generated,
        num_cached_tokens=child.num_cached_tokens,
        num_preemptions=child.num_preemptions,
        max_tokens=child.params.max_tokens,
        e2e_seconds=now - child.admitted_at,
        queue_seconds=None if scheduled is None else scheduled - child.admitted_at,
        ttft_seconds=None if first is None else first - child.admitted_at,
        inter_token_seconds=tuple(child.inter_token),
        prefill_seconds=first - scheduled if started else None,  # type: ignore[operator]
        decode_seconds=last - first if started else None,  # type: ignore[operator]
        inference_seconds=last - scheduled if started else None,  # type: ignore[operator]
    )

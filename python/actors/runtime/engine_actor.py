"""The engine actor: owns the EngineCore, feeds it admits, aborts and controls, runs its steps.

    tokenizer --EngineRequest (admit channel)--> engine actor --TokenBatch (batch)--> tokenizer
    HTTP / tokenizer --abort_nowait()--> engine actor (a list, never blocks)
    admin --await control(Control)--> engine actor --ControlResult (one-shot reply)

Operator commands (pause, sleep, wake_up, abort_requests and the core's own) are answered by
the EngineControls half of the actor (actors.runtime.engine_controls). When requests reach an
idle engine, its first step waits (bounded) for the rest of their burst: actors.runtime.burst.

The core is touched only here: ``add``, ``abort`` and ``control`` between steps on the Trio
thread, ``step`` in a worker thread under a limiter of one (the core is not re-entrant, and
its native code releases the GIL, so the Trio thread keeps serving HTTP meanwhile). A step
is never cancelled midway: it leaves the core consistent.

The tokenizer <-> engine cycle has one edge that never blocks: the batch channel is written
with ``send_nowait`` only after taking a credit that the tokenizer returns once it has
processed a batch, so at most BATCH_CREDITS batches exist and the channel (of that size) is
never full. Shutdown needs no sentinel: the admit channel closes when the tokenizer's submit
loop ends; the actor then finishes what the core holds and closes the batch channel.

Fault injection (for the server's failure tests, off unless set): LLMSERVE_FAULT_AFTER_STEPS=N,
read once when the actor is built, makes every step after the N-th raise inside the worker
thread, exactly where a real step failure (a kernel error, an out-of-memory) would surface;
the points of LLMSERVE_FAULT_INJECT (actors.runtime.faults) ``engine`` (raise after the N-th
step) and ``bad_row`` (spoil one row before a step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from actors.core.protocol import EngineCore
from actors.errors import RequestRefused
from actors.messages import Abort, Admit, Control, ControlResult, RequestOutput, TokenBatch
from actors.params.kinds import request_kind
from actors.runtime import faults
from actors.runtime.burst import Arrivals
from actors.runtime.engine_controls import EngineControls
from actors.runtime.failures import EngineFailed, GenerationPaused
from actors.runtime.faults import InjectedFault
from actors.runtime.metric_events import (
    EngineStats,
    GroupFinished,
    MetricEvent,
    StepTokens,
    sequence_finished,
)
from actors.runtime.outbox import ChoiceUpdate
from actors.runtime.request import Choice, EngineRequest, Registry, RequestState

log = logging.getLogger("actors.runtime.engine")

# Engine steps whose outputs may wait for detokenization at once: one being detokenized
# while the next runs keeps the core busy without letting the tokenizer fall behind.
BATCH_CREDITS = 2


class StepFailed(RuntimeError):
    """The core raised during a step: every in-flight request is lost."""


class EngineActor(EngineControls):
    def __init__(
        self,
        core: EngineCore,
        registry: Registry,
        admit_recv: trio.MemoryReceiveChannel[EngineRequest],
        batch_send: trio.MemorySendChannel[tuple[RequestOutput, ...]],
        metrics_send: trio.MemorySendChannel[MetricEvent],
        on_fatal: Callable[[BaseException], None],
        arrivals: Arrivals | None = None,
    ) -> None:
        """`arrivals` (shared with the front door and the tokenizer): an idle engine waits for
        the rest of a burst (actors.runtime.burst); without it every step starts at once."""
        self._core = core
        self._arrivals = arrivals
        self._registry = registry
        self._admit_recv = admit_recv
        self._batch_send = batch_send
        self._metrics_send = metrics_send
        self._on_fatal = on_fatal
        self._limiter = trio.CapacityLimiter(1)
        self.credits = trio.Semaphore(BATCH_CREDITS)
        # Admitted requests not yet handed to the core. Bounded by admission capacity:
        # each choice holds a slot that is not returned before it retires.
        self._admitted: list[EngineRequest] = []
        # (request, choice index or None: all of them); at most one entry per live choice
        # and one per live request, so bounded the same way.
        self._aborts: list[tuple[EngineRequest, int | None]] = []
        # Operator commands and their one-shot replies; one per awaiting caller.
        self._controls: list[tuple[Control, trio.MemorySendChannel[ControlResult]]] = []
        # Pauses and sleeps of mode "wait", answered once the core has drained.
        self._draining: list[tuple[Control, trio.MemorySendChannel[ControlResult]]] = []
        self._pause_mode: str | None = None  # the operator's /pause, until /resume
        self.refusing_new = False  # admits fail with GenerationPaused (pause abort|wait)
        self._holding = False  # nothing steps and admits wait (pause keep, drained pause)
        self._sleep_level: int | None = None  # asleep at that level until wake_up
        self._wakeup = trio.Event()
        self._admit_closed = False
        self._stepping = True  # False once the loop has ended (finished or failed)
        self._failed = False
        self._last_stats: EngineStats | None = None
        self.metrics_dropped = 0
        self._fault_after = faults.fault_after()
        self._steps = 0
        if self._fault_after is not None:
            log.warning("%s=%d: engine steps after that many will fail",
                        faults.AFTER_STEPS_ENV, self._fault_after)

    # -- called from other actors in the same thread ------------------------------------
    def abort_nowait(self, req: EngineRequest, index: int | None = None) -> None:
        """Stops every choice of `req`, or only choice `index` (a stop string matched).
        Never blocks; applied before the next step."""
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

    # -- the actor -------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        # Closing both channels on the way out ends the tokenizer's batch loop and the
        # metrics actor: shutdown cascades by closure.
        async with self._batch_send, self._metrics_send, trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_admits)
            task_status.started()
            try:
                await self._loop()
            except StepFailed as exc:
                log.error("%s; failing every in-flight request", exc)
                self._failed = True
                self._fail_everything()
                self._on_fatal(exc)
                await trio.sleep_forever()  # the supervisor decides when the process ends
            finally:
                self._stepping = False
                self._answer_stopped()
            nursery.cancel_scope.cancel()

    async def _receive_admits(self) -> None:
        async with self._admit_recv:
            async for req in self._admit_recv:
                received = [req]
                # What else is queued, with no checkpoint between: a request's prompts,
                # sent together, reach the core before the same step.
                while True:
                    try:
                        received.append(self._admit_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break  # the loop itself ends at the end of the channel
                self._admitted.extend(received)
                if self._arrivals is not None:
                    self._arrivals.settled(len(received))
                self._wakeup.set()
        self._admit_closed = True
        self._wakeup.set()

    async def _loop(self) -> None:
        core = self._core
        while True:
            self._apply_aborts()
            self._apply_admits()
            await self._answer_controls()
            self._publish_stats()
            if self._admit_closed and (self._holding or self._sleep_level is not None):
                self._release_for_shutdown()
            if not self.stepping_allowed or not core.has_unfinished():
                if self._admit_closed and not self._admitted and not core.has_unfinished():
                    return
                idle = self.stepping_allowed and not core.has_unfinished()
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                if idle and self._admitted:  # the first step waits for the rest of a burst
                    await self._gather_burst()
                continue
            await self.credits.acquire()
            started = time.monotonic()
            batch = await self._step()
            self._note_schedule(batch, started)
            self._account(batch)
            self._batch_send.send_nowait(batch.outputs)  # never raises WouldBlock: credits
            faults.check("engine")

    async def _gather_burst(self) -> None:
        if self._arrivals is not None and self.admits_flow:
            info = self._core.info
            await self._arrivals.gather(self._admitted, info.max_num_batched_tokens,
                                        info.max_num_seqs)

    def _step_in_thread(self) -> TokenBatch:
        self._steps += 1
        if self._fault_after is not None and self._steps > self._fault_after:
            raise InjectedFault(f"injected fault at engine step {self._steps}")
        faults.maybe_spoil_row(self._core)
        return self._core.step()

    async def _step(self) -> TokenBatch:
        try:
            return await trio.to_thread.run_sync(self._step_in_thread, limiter=self._limiter)
        except Exception as exc:
            log.error("engine step failed", exc_info=exc)
            raise StepFailed(f"engine step failed: {type(exc).__name__}") from exc

    # -- between steps -------------------------------------------------------------------
    def _apply_admits(self) -> None:
        admitted, self._admitted = self._admitted, []
        for req in admitted:
            if req.abort_requested or req.done:
                self._retire_all(req, "abort")
                continue
            if self.refusing_new:
                found = self._registry.engine_requests.get(req.engine_id)
                if found is not None:
                    found[0].outbox.fail(GenerationPaused())
                self._retire_all(req, "abort")
                continue
            if not self.admits_flow:  # held until resume or wake_up
                self._admitted.append(req)
                continue
            try:
                self._core.add(Admit(req.engine_id, tuple(req.prompt_token_ids),
                                     request_kind(req.params, req.pooling, req.encoder_input),
                                     arrival_time=req.admitted_at,
                                     priority=req.params.priority))
            except RequestRefused as exc:  # the core's own checks; the edge should catch these
                log.warning("engine refused %s: %s", req.engine_id, exc)
                found = self._registry.engine_requests.get(req.engine_id)
                if found is not None:
                    found[0].outbox.fail(RequestRefused("the request was refused by the engine",
                                                        exc.param))
                self._retire_all(req, "error")
                continue
            req.in_engine = True

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        for req, index in aborts:
            if not req.in_engine or req.done:
                continue  # its Admit has not been applied yet (it retires there) or it is gone
            self._core.abort(Abort(req.engine_id, index))
            # The core reports nothing for what it aborts: those choices retire here.
            for choice in req.live_choices() if index is None else [req.choices[index]]:
                self._retire(req, choice, choice.finish_reason or "abort")

    # -- whether it steps, aborts ------------------------------------------------------
    @property
    def stepping_allowed(self) -> bool:
        return not self._holding and self._sleep_level is None

    @property
    def admits_flow(self) -> bool:
        """New requests reach the core (else they wait in the actor): not while paused in
        keep mode, draining for a wait, or asleep."""
        return self.stepping_allowed and not self._draining

    def abort_state(self, state: RequestState) -> None:
        """Ends every unfinished choice of `state` with finish_reason "abort" (a consumer
        still reading sees it; a closed Outbox drops it) and stops it in the engine."""
        state.cancelled = True  # a request still being tokenized is never admitted
        for req in state.engine_requests:
            for choice in req.choices:
                if not state.outbox.is_finished(choice.outbox_index):
                    state.outbox.push(ChoiceUpdate(choice.outbox_index, finish_reason="abort"))
                if choice.finish_reason is None and not choice.retired:
                    choice.finish_reason = "abort"
            self.abort_nowait(req)

    def _release_for_shutdown(self) -> None:
        """Shutting down while paused or asleep: what cannot run any more ends now."""
        self._abort_requests(None)
        for req in self._admitted:
            self._retire_all(req, "abort")
        self._admitted.clear()

    def _publish_stats(self) -> None:
        stats = self._core.stats()
        if stats != self._last_stats:
            self._last_stats = stats
            self._emit(stats)

    # -- after a step ----------------------------------------------------------------------
    def _note_schedule(self, batch: TokenBatch, started: float) -> None:
        """Preemptions per choice, and when each newly admitted request was first scheduled
        (its queue time ends there, although a long prompt's first token comes several
        chunked steps later; the forked choices start with it)."""
        for engine_id, index in batch.preempted:
            choice = self._choice(engine_id, index)
            if choice is not None:
                choice.num_preemptions += 1
        if batch.scheduled and self._arrivals is not None:
            self._arrivals.note_step(time.monotonic() - started)
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

    def _account(self, batch: TokenBatch) -> None:
        now = time.monotonic()
        prompt = cached = generated = 0
        for out in batch.outputs:
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
        self._emit(StepTokens(prompt, cached, generated, len(batch.scheduled)))

    # -- retirement --------------------------------------------------------------------
    def _fail_everything(self) -> None:
        """After a step failed: fail and retire everything without touching the core."""
        for state in list(self._registry.requests.values()):
            state.outbox.fail(EngineFailed())
        for _state, req in list(self._registry.engine_requests.values()):
            self._retire_all(req, "error")
        for req in self._admitted:
            self._retire_all(req, "error")
        self._admitted.clear()

    def _retire_all(self, req: EngineRequest, reason: str) -> None:
        for choice in req.live_choices():
            self._retire(req, choice, choice.finish_reason or reason)

    def _retire(self, req: EngineRequest, choice: Choice, reason: str) -> None:
        if choice.retired:
            return
        choice.retired = True
        if choice.finish_reason is None:
            choice.finish_reason = reason
        self._emit(sequence_finished(req, choice, time.monotonic()))
        if req.live_choices():
            return
        req.done = True
        req.in_engine = False
        self._emit(GroupFinished(len(req.choices), max(c.num_generated for c in req.choices)))
        found = self._registry.engine_requests.get(req.engine_id)
        if found is not None:
            found[0].note_retired()

    def _emit(self, event: MetricEvent) -> None:
        try:
            self._metrics_send.send_nowait(event)
        except trio.WouldBlock:
            self.metrics_dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


"""The engine actor: owns the EngineCore, feeds it admits, aborts and controls, runs its steps.

    tokenizer --Admit | AbortChoices | NoMoreAdmits (inbox)--> engine actor
    engine actor --Delivery(outputs, retired) | EngineDown (batch)--> tokenizer
    admin --await control(Control)--> engine actor --ControlResult (one-shot reply)

The messages are actors.runtime.messages'. The actor writes no request state: the
tokenizer actor owns each request, its choices and its Outbox, and learns from a Retired
(beside the step's outputs) that the engine will never touch a choice again, and from a
Refused why an admit was turned down. What the actor keeps per admitted prompt (whether
the core holds it, which choices live, their timing for the metrics) is its own ledger
(actors.runtime.accounting). Whether it steps and takes new requests is the pause machine
(actors.runtime.pause_states), driven by the operator commands of actors.runtime
.engine_controls. When requests reach an idle engine, its first step waits (bounded) for
the rest of their burst: actors.runtime.burst.

The core is touched only here: ``add``, ``abort`` and ``control`` between steps on the Trio
thread, ``step`` in a worker thread under a limiter of one (the core is not re-entrant, and
its native code releases the GIL, so the Trio thread keeps serving HTTP meanwhile);
``prepare_grammar`` at any time (the core compiles on its grammar workers while this loop
awaits). A step is never cancelled midway: it leaves the core consistent.

The tokenizer <-> engine cycle has one edge that never blocks: the batch channel is written
with ``send_nowait`` only after taking a credit that the tokenizer returns once it has
processed a message, so at most BATCH_CREDITS messages exist and the channel (of that size)
is never full. Retirements between steps ride on the next step's Delivery, or on their own
(taking a credit) when no step follows. Shutdown: the inbox carries NoMoreAdmits once the
tokenizer's submissions have ended; the actor then finishes what the core holds and closes
the batch channel (and the metrics channel), which ends the tokenizer's and metrics' loops.

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
from actors.messages import (
    Abort,
    Admit,
    Control,
    ControlResult,
    EngineStats,
    GrammarVerdict,
    PrepareGrammar,
    TokenBatch,
)
from actors.runtime import faults
from actors.runtime.accounting import Entry, Ledger
from actors.runtime.burst import Arrivals
from actors.runtime.engine_controls import EngineControls
from actors.runtime.failures import EngineFailed, GenerationPaused
from actors.runtime.faults import InjectedFault
from actors.runtime.messages import (
    AbortChoices,
    BatchMessage,
    ChoiceTiming,
    Delivery,
    EngineDown,
    EngineInbox,
    MetricEvent,
    NoMoreAdmits,
    Refused,
    Retired,
)
from actors.runtime.pause_states import PauseStates

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
        inbox: trio.MemoryReceiveChannel[EngineInbox],
        batch_send: trio.MemorySendChannel[BatchMessage],
        credits: trio.Semaphore,
        metrics_send: trio.MemorySendChannel[MetricEvent],
        on_fatal: Callable[[BaseException], None],
        arrivals: Arrivals | None = None,
        report_timings: bool = False,
    ) -> None:
        """`credits` (BATCH_CREDITS, returned by the reader of `batch_send`): one is taken
        before each send. `arrivals` (shared with the front door and the tokenizer): an
        idle engine waits for the rest of a burst (actors.runtime.burst); without it every
        step starts at once. `report_timings`: each Delivery carries its outputs' choice
        clocks (the per-request metrics); off, it carries none."""
        self._core = core
        self._report_timings = report_timings
        self._arrivals = arrivals
        self._inbox = inbox
        self._batch_send = batch_send
        self._credits = credits
        self._metrics_send = metrics_send
        self._on_fatal = on_fatal
        self._limiter = trio.CapacityLimiter(1)
        self._ledger = Ledger()
        # Received admits not yet handed to the core. Bounded by admission capacity: each
        # choice holds a slot that is not returned before it retires.
        self._admitted: list[Admit] = []
        # Aborts of requests the core holds, applied before the next step: at most one per
        # live choice and one per live request (the tokenizer sends each once).
        self._aborts: list[AbortChoices] = []
        # Retirements (and refusals) not yet sent: one per live choice at most.
        self._outgoing: list[Retired | Refused] = []
        # Operator commands and their one-shot replies; one per awaiting caller.
        self._controls: list[tuple[Control, trio.MemorySendChannel[ControlResult]]] = []
        self._pause: PauseStates[tuple[Control, trio.MemorySendChannel[ControlResult]]] = (
            PauseStates(busy=core.has_unfinished, abort_all=self._abort_everything,
                        reset_cache=self._reset_cache))
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

    def refusal(self) -> GenerationPaused | None:
        """Why a new request would be refused now (paused in abort or wait mode), else None:
        the front door answers it before any response starts."""
        return self._pause.refusal()

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        """A constraint compiled before its request is admitted, in the core's process
        (EngineCore.prepare_grammar): the compile never runs on the step thread nor this
        loop, and steps go on meanwhile."""
        return await self._core.prepare_grammar(request)

    def release_grammar(self, pin: int) -> None:
        self._core.release_grammar(pin)

    # -- the actor -------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        # Closing both channels on the way out ends the tokenizer's batch loop and the
        # metrics actor: shutdown cascades by closure.
        async with self._batch_send, self._metrics_send, trio.open_nursery() as nursery:
            nursery.start_soon(self._receive)
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

    async def _receive(self) -> None:
        async with self._inbox:
            async for message in self._inbox:
                received = [message]
                # What else is queued, with no checkpoint between: a request's prompts,
                # sent together, reach the core before the same step.
                while True:
                    try:
                        received.append(self._inbox.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break  # the loop itself ends at the end of the channel
                admits = 0
                for m in received:
                    if isinstance(m, Admit):
                        self._ledger.add(m)
                        self._admitted.append(m)
                        admits += 1
                    elif isinstance(m, AbortChoices):
                        self._note_abort(m)
                    elif isinstance(m, NoMoreAdmits):
                        self._admit_closed = True
                if admits and self._arrivals is not None:
                    self._arrivals.settled(admits)
                self._wakeup.set()
        self._admit_closed = True  # the tokenizer has ended
        self._wakeup.set()

    async def _loop(self) -> None:
        core = self._core
        while True:
            self._apply_aborts()
            self._apply_admits()
            await self._answer_controls()
            self._publish_stats()
            if self._admit_closed and self._pause.stopped_at_shutdown:
                self._release_for_shutdown()
            stepping = self._pause.stepping_allowed
            if not stepping or not core.has_unfinished():
                if self._outgoing:  # no step follows to carry them
                    await self._credits.acquire()
                    self._send(Delivery((), self._take_outgoing()))
                    continue
                if self._admit_closed and not self._admitted and not core.has_unfinished():
                    return
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                if stepping and self._admitted:  # the first step waits for the rest of a burst
                    await self._gather_burst()
                continue
            await self._credits.acquire()
            started = time.monotonic()
            batch = await self._step()
            timings = self._account(batch, started)
            self._send(Delivery(batch.outputs, self._take_outgoing(), timings,
                                batch.weight_version))
            faults.check("engine")

    def _send(self, message: BatchMessage) -> None:
        self._batch_send.send_nowait(message)  # never raises WouldBlock: credits

    def _take_outgoing(self) -> tuple[Retired | Refused, ...]:
        outgoing, self._outgoing = self._outgoing, []
        return tuple(outgoing)

    async def _gather_burst(self) -> None:
        if self._arrivals is not None and self._pause.admits_flow:
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
    def _note_abort(self, message: AbortChoices) -> None:
        """Records an abort at once (its reason is the choice's finish reason from now on);
        the core hears of it before the next step. An abort of what already retired (its
        Admit came first on this inbox, so it is not unknown) is ignored."""
        entry = self._ledger.get(message.engine_id)
        if entry is None:
            return
        if message.index is None:
            if entry.abort_requested:
                return
            entry.abort_requested = True
            clocks = [entry.choices[i] for i in entry.live()]
        else:
            clocks = [entry.choices[message.index]]
            if clocks[0].retired:
                return
        for clock in clocks:
            if clock.finish_reason is None:
                clock.finish_reason = message.reason
        self._aborts.append(message)
        self._wakeup.set()

    def _apply_admits(self) -> None:
        admitted, self._admitted = self._admitted, []
        for admit in admitted:
            entry = self._ledger.get(admit.request_id)
            if entry is None:
                continue
            if entry.abort_requested:
                self._retire_all(entry, "abort")
                continue
            refusal = self._pause.refusal()
            if refusal is not None:
                self._outgoing.append(Refused(admit.request_id, refusal))
                self._retire_all(entry, "abort")
                continue
            if not self._pause.admits_flow:  # held until resume or wake_up
                self._admitted.append(admit)
                continue
            try:
                self._core.add(admit)
            except RequestRefused as exc:  # the core's own checks; the edge should catch these
                log.warning("engine refused %s: %s", admit.request_id, exc)
                self._outgoing.append(Refused(admit.request_id, RequestRefused(
                    "the request was refused by the engine", exc.param)))
                self._retire_all(entry, "error")
                continue
            entry.in_engine = True

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        for message in aborts:
            entry = self._ledger.get(message.engine_id)
            if entry is None or not entry.in_engine:
                continue  # not in the core yet (it retires at admission) or gone
            self._core.abort(Abort(message.engine_id, message.index))
            # The core reports nothing for what it aborts: those choices retire here.
            for i in entry.live() if message.index is None else [message.index]:
                self._retire(message.engine_id, i, "abort")

    def _abort_everything(self) -> None:
        """Ends every request the engine holds with finish_reason "abort" (pause or sleep in
        abort mode, shutdown while paused)."""
        for entry in self._ledger.entries():
            self._note_abort(AbortChoices(entry.admit.request_id, None, "abort"))
        self._apply_aborts()

    def _reset_cache(self) -> None:
        self._apply_control(Control("reset_prefix_cache"))

    def _release_for_shutdown(self) -> None:
        """Shutting down while paused or asleep: what cannot run any more ends now."""
        self._abort_everything()
        for admit in self._admitted:
            entry = self._ledger.get(admit.request_id)
            if entry is not None:
                self._retire_all(entry, "abort")
        self._admitted.clear()

    def _publish_stats(self) -> None:
        stats = self._core.stats()
        if stats != self._last_stats:
            self._last_stats = stats
            self._emit(stats)

    # -- after a step ----------------------------------------------------------------------
    def _account(self, batch: TokenBatch, started: float) -> tuple[ChoiceTiming | None, ...]:
        """Books the step; returns its outputs' clocks when timings are reported."""
        self._ledger.note_schedule(batch, started)
        if batch.scheduled and self._arrivals is not None:
            self._arrivals.note_step(time.monotonic() - started)
        tokens, finished = self._ledger.account(batch, time.monotonic())
        timings = self._ledger.timings(batch.outputs) if self._report_timings else ()
        for engine_id, index, reason in finished:
            self._retire(engine_id, index, reason)
        self._emit(tokens)
        return timings

    # -- retirement --------------------------------------------------------------------
    def _fail_everything(self) -> None:
        """After a step failed: every request fails and retires (the tokenizer fails their
        Outboxes); the core is not touched again. The failed step's credit carries it."""
        for entry in self._ledger.entries():
            self._retire_all(entry, "error")
        self._admitted.clear()
        self._outgoing.clear()
        self._send(EngineDown(EngineFailed()))

    def _retire_all(self, entry: Entry, reason: str) -> None:
        for i in entry.live():
            self._retire(entry.admit.request_id, i, reason)

    def _retire(self, engine_id: str, index: int, reason: str) -> None:
        retired = self._ledger.retire(engine_id, index, reason, time.monotonic())
        if retired is None:
            return
        final, events = retired
        for event in events:
            self._emit(event)
        self._outgoing.append(Retired(engine_id, index, final))

    def _emit(self, event: MetricEvent) -> None:
        try:
            self._metrics_send.send_nowait(event)
        except trio.WouldBlock:
            self.metrics_dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

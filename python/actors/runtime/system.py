"""The composition root of the engine side: channels with their bounds, the registry,
admission, and the actors started in order under one nursery.

    submit ⇢ tokenizer ⇢ inbox ⇢ engine actor ⇢ batch ⇢ tokenizer ⇢ Outbox (per request)
                                  engine actor ⇢ metrics (send_nowait, drops when full)

Every channel carries the frozen messages of actors.runtime.messages (Submit; Admit,
AbortChoices, NoMoreAdmits; Delivery with its Retired and Refused, EngineDown; the metric
events); the tokenizer actor owns the request state they refer to.

    system = await nursery.start(run_actor_system, core, tokenizer, capacity=..., ...)
    system.registry.add(state); await system.submit(state)
    system.refusal()  # GenerationPaused while paused in abort or wait mode, else None
    system.abort(state); await system.control(Control(...))
    verdict = await system.prepare_grammar(PrepareGrammar(spec)); system.release_grammar(pin)
    system.close_submissions()  # shutdown by closure: every actor ends once its input does

Nothing here knows HTTP: a front end (python -m server, a test) builds RequestStates,
registers and submits them and reads their Outboxes; it decides what a failure means to its
own clients.

Supervision: an exception out of an actor once it has started (a bug, or an injected fault)
fails every in-flight request and calls ``on_fatal``; it does not tear the other actors down
under open requests, the owner of the nursery decides when to stop. A failure while starting
is raised to the caller of ``nursery.start``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from actors.core.protocol import EngineCore
from actors.messages import Control, ControlResult, EngineInfo, GrammarVerdict, PrepareGrammar
from actors.runtime.admission import Admission
from actors.runtime.burst import DEFAULT_WINDOW, AdmissionWindow, Arrivals
from actors.runtime.engine_actor import BATCH_CREDITS, EngineActor
from actors.runtime.failures import GenerationPaused, ServerFailed
from actors.runtime.messages import (
    AbortRequest,
    BatchMessage,
    EngineInbox,
    MetricEvent,
    Submit,
)
from actors.runtime.metrics_actor import METRICS_CHANNEL_SIZE, MetricsActor, cache_config_info
from actors.runtime.prompt_bounds import PromptCharBound
from actors.runtime.request import Registry, RequestState
from actors.runtime.tokenizer_actor import INBOX_PER_SLOT, TokenizerActor
from actors.text.detokenizer import TokenTexts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

__all__ = ["ActorSystem", "run_actor_system"]

log = logging.getLogger("actors.runtime.system")


@dataclass(eq=False)
class ActorSystem:
    """The handle a front end holds: what it may do to the running actors."""

    info: EngineInfo
    registry: Registry
    admission: Admission
    engine: EngineActor
    tokenizer: TokenizerActor
    metrics: MetricsActor
    _submit_send: trio.MemorySendChannel[Submit]
    arrivals: Arrivals  # prompts on their way to the engine (actors.runtime.burst)
    stopped: trio.Event = field(default_factory=trio.Event)  # every actor has ended

    @property
    def capacity(self) -> int:
        return self.admission.capacity

    @property
    def queued_prompt_tokens(self) -> int:
        """Prompt tokens sent to the engine whose choices have had no output yet."""
        return self.tokenizer.queued_prompt_tokens

    @property
    def token_texts(self) -> TokenTexts:
        return self.tokenizer.token_texts

    @property
    def prompt_bound(self) -> PromptCharBound:
        return self.tokenizer.prompt_bound

    def refusal(self) -> GenerationPaused | None:
        """Why a new request is refused now (the operator paused in abort or wait mode), else
        None; the engine refuses an admit already on its way the same way (Refused)."""
        return self.engine.refusal()

    async def submit(self, state: RequestState) -> None:
        """Hands a registered request holding its admission slots to the tokenizer. Never
        blocks (the channel holds `capacity`); raises trio.ClosedResourceError once
        submissions are closed."""
        if self.registry.requests.get(state.request_id) is not state:
            raise RuntimeError(f"request {state.request_id!r} was not registered")
        self.arrivals.arrived(len(state.prompts))  # before: the tokenizer may settle it at once
        try:
            await self._submit_send.send(Submit(state.request_id))
        except BaseException:
            self.arrivals.settled(len(state.prompts))
            raise

    def abort(self, state: RequestState) -> None:
        """Ends every unfinished choice with finish_reason "abort" (a consumer still reading
        sees it; a closed Outbox drops it) and stops the request in the engine."""
        if self.registry.requests.get(state.request_id) is state:
            self.tokenizer.abort(AbortRequest(state.request_id))
        else:  # never submitted (or gone): nothing of it runs
            state.cancelled = True

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        """Compiles a request's constraint in the engine core's process before the request
        is admitted; an "ok" stays pinned there until ``release_grammar(verdict.pin)``."""
        return await self.engine.prepare_grammar(request)

    def release_grammar(self, pin: int) -> None:
        self.engine.release_grammar(pin)

    async def control(self, command: Control) -> ControlResult:
        """An operator command, applied by the engine between two steps. abort_requests
        (by id, or all) is matched by the tokenizer, which owns the requests, and answered
        with how many it aborted once the engine has applied the aborts."""
        if command.command != "abort_requests":
            return await self.engine.control(command)
        count = self.tokenizer.abort_named(dict(command.args).get("request_ids"))
        result = await self.engine.control(command)
        return ControlResult(True, count) if result.ok else result

    def close_submissions(self) -> None:
        """No more requests: the tokenizer finishes what it holds, closes the admit channel,
        the engine actor finishes what the core holds and closes the batch channel, and so
        on until every actor has ended (then `stopped` is set)."""
        self._submit_send.close()


async def run_actor_system(
    core: EngineCore,
    tokenizer: PreTrainedTokenizerFast,
    *,
    capacity: int,
    model_name: str,
    on_fatal: Callable[[BaseException], None],
    engine_index: int = 0,
    admission_window: AdmissionWindow = DEFAULT_WINDOW,
    report_timings: bool = False,
    task_status: trio.TaskStatus[ActorSystem] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Starts engine -> tokenizer -> metrics and reports the handle; returns once every
    actor has ended. `tokenizer` is a transformers tokenizer of ``core.info.model_dir``;
    `capacity` is the admission capacity in choices, which every channel bound below is
    stated in; `engine_index` is this engine's `engine` label in /metrics;
    `report_timings`: each choice's last update carries its clock (ChoiceUpdate.timing)."""
    info = core.info
    registry = Registry()
    # Bounds: see tokenizer_actor (submit: `capacity`; inbox: INBOX_PER_SLOT x capacity),
    # engine_actor (batch: BATCH_CREDITS, each send under a credit the tokenizer returns)
    # and metrics_actor (drop when full). Every send but submit's is send_nowait.
    submit_send, submit_recv = trio.open_memory_channel[Submit](capacity)
    inbox_send, inbox_recv = trio.open_memory_channel[EngineInbox](INBOX_PER_SLOT * capacity)
    batch_send, batch_recv = trio.open_memory_channel[BatchMessage](BATCH_CREDITS)
    credits = trio.Semaphore(BATCH_CREDITS)
    metrics_send, metrics_recv = trio.open_memory_channel[MetricEvent](METRICS_CHANNEL_SIZE)
    arrivals = Arrivals(admission_window)
    engine = EngineActor(core, inbox_recv, batch_send, credits, metrics_send, on_fatal,
                         arrivals, report_timings=report_timings)
    tokenizer_actor = TokenizerActor(tokenizer, registry, submit_recv, inbox_send, batch_recv,
                                     credits, vocab_size=info.vocab_size, arrivals=arrivals)
    metrics = MetricsActor(model_name, info.max_model_len, metrics_recv,
                           cache_info=cache_config_info(info), engine=engine_index)
    system = ActorSystem(info, registry, Admission(capacity), engine, tokenizer_actor,
                         metrics, submit_send, arrivals)
    supervised = partial(_supervised, registry, on_fatal)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervised, "engine", engine.run)
            await nursery.start(supervised, "tokenizer", tokenizer_actor.run)
            await nursery.start(supervised, "metrics", metrics.run)
            task_status.started(system)
    finally:
        system.stopped.set()


async def _supervised(registry: Registry, on_fatal: Callable[[BaseException], None],
                      name: str, run: Callable[..., Any], *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    status = _StartWatch(task_status)
    try:
        await run(task_status=status)
    except BaseException as exc:
        failure = _failure_of(exc)
        if failure is None or not status.started_once:
            raise
        log.critical("the %s actor failed; failing every in-flight request", name,
                     exc_info=failure)
        registry.fail_all(ServerFailed())
        on_fatal(failure)


class _StartWatch:
    """A task status that remembers whether the actor called started()."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self._inner = inner
        self.started_once = False

    def started(self, value: Any = None) -> None:
        self.started_once = True
        self._inner.started(value)


def _failure_of(exc: BaseException) -> BaseException | None:
    """What in `exc` is a failure rather than cancellation (a group keeps its Exceptions)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(Exception)[0]
    return exc if isinstance(exc, Exception) else None

"""The tokenizer actor: prompts in, detokenized deltas out; the one owner of request state.

Two loops share the actor:
- submissions: render (chat templates) and tokenize prompts in a worker thread, check them
  against the context, and admit one engine request per prompt, with the request's n choices,
  to the engine actor; every request waiting at that moment goes in the same worker-thread
  call (actors.runtime.prompt_prep), so a burst reaches the engine together;
- batches: turn each engine step's token ids into text with each choice's incremental
  detokenizer (stop strings included), push the result into the request's Outbox, and
  retire what the engine says it retired (actors.runtime.messages: Delivery, Refused,
  Retired, EngineDown).

It writes every RequestState, EngineRequest, Choice and Outbox of the engine side: the
engine actor only sends messages. An abort (``abort``: HTTP's AbortRequest, an operator's
``abort_named``, a stop string) ends the choices here and sends AbortChoices to the engine.

Channel bounds (capacity = the admission capacity, in engine sequences):
- submit channel (HTTP -> here), size `capacity`: a request is submitted only while it holds
  at least one admission slot and is submitted once, so at most `capacity` are in it;
- engine inbox (here -> engine actor), size `INBOX_PER_SLOT x capacity`: one Admit per
  prompt, whose n choices hold n slots until they retire (after the engine actor has read
  it); at most one AbortChoices per choice and one per engine request, each sent while
  its slots are held; and one NoMoreAdmits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from dataclasses import replace

import trio

from actors.errors import RequestRefused
from actors.messages import Admit, RequestOutput
from actors.params.kinds import request_kind
from actors.runtime import faults
from actors.runtime.burst import Arrivals
from actors.runtime.failures import ClientGone, Outcome, PrepareFailed, RowRefused
from actors.runtime.messages import (
    AbortChoices,
    AbortRequest,
    BatchMessage,
    ChoiceTiming,
    EngineDown,
    EngineInbox,
    NoMoreAdmits,
    Refused,
    Retired,
    Submit,
)
from actors.runtime.outbox import ChoiceUpdate
from actors.runtime.prompt_bounds import PromptCharBound
from actors.runtime.prompt_prep import PromptPreparer
from actors.runtime.request import Choice, EngineRequest, Registry, RequestState
from actors.runtime.token_logprobs import (
    Logprobs,
    has_logprobs,
    logprobs_of,
    named_ids,
    prompt_logprobs_of,
)
from actors.text.detokenizer import IncrementalDetokenizer, TokenTexts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger("actors.runtime.tokenizer")

# Requests prepared in one trip to the worker thread, at most: a burst's prompts reach the
# engine together, and the requests behind a trip wait for at most this many renders.
PREPARE_BATCH = 32
# The engine inbox's size per admission slot (see the bounds above): an Admit and two
# aborts (its choice's and its request's) per slot, and one slot's worth to spare.
INBOX_PER_SLOT = 4


class TokenizerActor:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        registry: Registry,
        submit_recv: trio.MemoryReceiveChannel[Submit],
        engine_send: trio.MemorySendChannel[EngineInbox],
        batch_recv: trio.MemoryReceiveChannel[BatchMessage],
        credits: trio.Semaphore,
        *,
        vocab_size: int,
        arrivals: Arrivals | None = None,
    ) -> None:
        """`credits`: returned once each batch message is processed (the engine actor takes
        one per send). `arrivals`: settled here for every prompt that will never reach the
        engine."""
        self._arrivals = arrivals
        self._tokenizer = tokenizer  # a transformers PreTrainedTokenizerFast
        self._backend = tokenizer.backend_tokenizer  # the Rust tokenizers.Tokenizer
        self._registry = registry
        self._submit_recv = submit_recv
        self._engine_send = engine_send
        self._batch_recv = batch_recv
        self._credits = credits
        self._vocab_size = vocab_size
        self._limiter = trio.CapacityLimiter(1)
        # Logprob token texts, decoded here off the event loop; the HTTP side reads them.
        self.token_texts = TokenTexts(self._backend, vocab_size)
        self.prompt_bound = PromptCharBound(self._backend)
        self._preparer = PromptPreparer(self._backend, self.prompt_bound, vocab_size)
        # vLLM's prefill backlog (its output processor's get_num_queued_tokens): the prompt
        # tokens of every choice sent to the engine that has had no output yet, n choices
        # counting n times; the HTTP edge refuses new requests at --max-num-queued-tokens.
        self.queued_prompt_tokens = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        # The engine inbox stays open for aborts after the submissions end; it closes
        # once the engine actor has ended (the batch channel closed).
        async with self._engine_send, trio.open_nursery() as nursery:
            nursery.start_soon(self._submissions)
            nursery.start_soon(self._batches)
            task_status.started()

    # -- aborts (HTTP, the operator, a stop string) ----------------------------------------
    def abort(self, message: AbortRequest) -> None:
        """Ends every unfinished choice with finish_reason "abort" (a consumer still reading
        sees it; a closed Outbox drops it) and stops the request in the engine; a request
        still being tokenized is never admitted. Never blocks."""
        state = self._registry.requests.get(message.request_id)
        if state is None:
            return
        state.cancelled = True
        for req in state.engine_requests:
            for choice in req.choices:
                if not state.outbox.is_finished(choice.outbox_index):
                    state.outbox.push(choice.ending("abort"))
            self._stop(req, None, "abort")

    def abort_named(self, request_ids: list[str] | None) -> int:
        """Aborts every tokenized request (all, or those whose internal or public id is
        named: the part before the internal id's last "."); returns how many."""
        wanted = set(request_ids or ())
        count = 0
        for state in list(self._registry.requests.values()):
            if not state.ready.is_set() or state.retired.is_set():
                continue
            rid = state.request_id
            if wanted and not wanted & {rid, rid.rsplit(".", 1)[0]}:
                continue
            self.abort(AbortRequest(rid))
            count += 1
        return count

    def _stop(self, req: EngineRequest, index: int | None, reason: str) -> None:
        """Asks the engine to stop choice `index` (None: all) of `req`, once."""
        if index is None:
            if req.done or req.abort_requested:
                return
            req.abort_requested = True
        else:
            choice = req.choices[index]
            if choice.retired or choice.abort_requested:
                return
            choice.abort_requested = True
        self._to_engine(AbortChoices(req.engine_id, index, reason))

    def _to_engine(self, message: EngineInbox) -> None:
        try:
            self._engine_send.send_nowait(message)  # never full: see the bounds above
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the engine actor has ended: nothing of it runs any more

    # -- submissions -----------------------------------------------------------------
    async def _submissions(self) -> None:
        async with self._submit_recv:
            async for submit in self._submit_recv:
                submits = [submit]
                # Whatever else is waiting (a burst) is prepared in the same trip to the
                # worker thread and admitted together: the engine actor receives it as one.
                while len(submits) < PREPARE_BATCH:
                    try:
                        submits.append(self._submit_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                states = [self._registry.requests[s.request_id] for s in submits]
                await self._admit(states)
        self._to_engine(NoMoreAdmits())

    def _settle(self, prompts: int) -> None:
        if self._arrivals is not None:
            self._arrivals.settled(prompts)

    async def _admit(self, states: list[RequestState]) -> None:
        live = []
        for state in states:
            if state.cancelled:
                self._settle(len(state.prompts))
                state.fail_before_start(ClientGone())
            else:
                live.append(state)
        if not live:
            return
        prepared = await trio.to_thread.run_sync(self._preparer.prepare_each, live,
                                                 limiter=self._limiter)
        for state, results in zip(live, prepared):
            if isinstance(results, BaseException):
                self._settle(len(state.prompts))
                if isinstance(results, RequestRefused):  # the prompt checks, or the render
                    state.fail_before_start(results)
                else:
                    log.error("preparing the prompt of %s failed", state.request_id,
                              exc_info=results)
                    state.fail_before_start(PrepareFailed())
                continue
            state.prompt_results = results
            self._make_engine_requests(state)
            self._registry.add_engine_requests(state)
            state.ready.set()
            for req in state.engine_requests:
                if state.cancelled or req.abort_requested:
                    self._settle(1)
                    req.done = True
                    for choice in req.choices:
                        choice.retired = True
                    continue
                # Never blocks (see the bound above), and no checkpoint between prompts and
                # requests: the engine actor takes them all into the same step.
                self._to_engine(req.admit)
                for choice in req.choices:
                    choice.prefilling = True
                self.queued_prompt_tokens += len(req.admit.prompt_token_ids) * len(req.choices)
            state.note_retired()

    def _make_engine_requests(self, state: RequestState) -> None:
        """One engine request per prompt carrying all n choices: the engine runs the prompt
        once and forks the rest from it, sharing its KV blocks."""
        params = state.params
        n = params.n
        for p, result in enumerate(state.prompt_results):
            room = state.max_model_len - len(result.token_ids)
            max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
            changes: dict = {"max_tokens": max_tokens}
            if params.reasoning_gate is not None:  # the rendered prompt may open reasoning
                changes["reasoning_gate"] = params.reasoning_gate.for_prompt(result.text)
            req = EngineRequest(Admit(
                f"{state.request_id}-{p}", tuple(result.token_ids),
                request_kind(replace(params, **changes), state.pooling,
                             state.encoder_input, result.embeds),
                arrival_time=state.arrival, priority=params.priority), prompt_index=p)
            for i in range(n):
                req.choices.append(Choice(
                    index=i,
                    outbox_index=p * n + i,
                    detokenizer=IncrementalDetokenizer(
                        self._backend,
                        # an embeddings prompt has no text to continue from
                        prompt_token_ids=None if result.embeds else result.token_ids,
                        skip_special_tokens=params.skip_special_tokens,
                        # a beam search has no stop strings and never shows its EOS (vLLM)
                        stop=() if params.use_beam_search else params.stop,
                        include_stop_str_in_output=(params.include_stop_str_in_output
                                                    and not params.use_beam_search),
                    ),
                ))
            state.engine_requests.append(req)

    # -- engine output -----------------------------------------------------------------
    async def _batches(self) -> None:
        async with self._batch_recv:
            async for message in self._batch_recv:
                try:
                    if isinstance(message, EngineDown):
                        self._fail_everything(message.error)
                        continue
                    faults.check("tokenizer")
                    outputs = message.outputs
                    converted = None
                    if any(has_logprobs(out) for out in outputs):
                        # Up to a million entries (a prompt's logprobs): not on the loop.
                        converted = await trio.to_thread.run_sync(self._convert_logprobs,
                                                                  outputs)
                    self._deliver(outputs, converted, message.timings, message.weight_version)
                    self._retire(message.retired)
                finally:
                    self._credits.release()

    def _retire(self, retired: tuple[Retired | Refused, ...]) -> None:
        for message in retired:
            found = self._registry.engine_requests.get(message.engine_id)
            if found is None:
                continue
            state, req = found
            if isinstance(message, Refused):
                state.outbox.fail(message.error)
                continue
            choice = req.choices[message.index]
            self._prefilled(req, choice)
            if choice.retired:
                continue
            choice.retired = True
            if choice.finish_reason is None:
                choice.finish_reason = message.reason
            if not state.outbox.is_finished(choice.outbox_index):  # aborted in the engine
                state.outbox.push(choice.ending(message.reason))
            if all(c.retired for c in req.choices):
                req.done = True
                state.note_retired()

    def _fail_everything(self, error: Outcome) -> None:
        """The engine failed: every request fails and every choice retires."""
        for state in list(self._registry.requests.values()):
            state.outbox.fail(error)
        for state, req in list(self._registry.engine_requests.values()):
            for choice in req.choices:
                self._prefilled(req, choice)
                if not choice.retired:
                    choice.retired = True
                    choice.finish_reason = choice.finish_reason or "error"
            req.done = True
            state.note_retired()

    def _prefilled(self, req: EngineRequest, choice: Choice) -> None:
        """The choice's first output (or its retirement): its prompt leaves the backlog."""
        if choice.prefilling:
            choice.prefilling = False
            self.queued_prompt_tokens -= len(req.admit.prompt_token_ids)

    def _convert_logprobs(self, outputs: tuple[RequestOutput, ...]
                          ) -> dict[tuple[str, int], Logprobs]:
        """Runs in a worker thread: each output's logprobs as TokenLogprobs, with the text
        of every token they name decoded into token_texts."""
        converted: dict[tuple[str, int], Logprobs] = {}
        for out in outputs:
            found = self._registry.engine_requests.get(out.request_id)
            if found is None or not has_logprobs(out):
                continue
            prompt = found[1].admit.prompt_token_ids
            lps = logprobs_of(list(out.new_token_ids), out)
            prompt_lps = prompt_logprobs_of(prompt, out)
            texts = self.token_texts
            texts.fill(named_ids(lps, prompt_lps, prompt))
            for lp in lps if prompt_lps is None else (*lps, *prompt_lps):
                if lp is not None:
                    lp.text = texts[lp.token_id]
                    lp.top_texts = tuple(texts[t] for t, _ in lp.top)
            converted[(out.request_id, out.index)] = (lps, prompt_lps)
        return converted

    def _deliver(self, outputs: tuple[RequestOutput, ...],
                 converted: dict[tuple[str, int], Logprobs] | None = None,
                 timings: tuple[ChoiceTiming | None, ...] = (),
                 weight_version: str = "default") -> None:
        """Each output's text into its choice's Outbox; the update that finishes a choice
        carries its weight-version spans and (`timings`: per-request metrics on) clock."""
        for i, out in enumerate(outputs):
            found = self._registry.engine_requests.get(out.request_id)
            if found is None:
                continue
            state, req = found
            choice = req.choices[out.index]
            self._prefilled(req, choice)
            if req.abort_requested or choice.abort_requested or choice.detokenizer is None:
                continue
            if out.finish_reason == "error":
                # The sampler refused this request's row; only this request fails (vLLM
                # answers an "error" finish with a 500).
                state.outbox.fail(RowRefused())
                continue
            if out.pooled is not None:
                state.outbox.push(ChoiceUpdate(index=choice.outbox_index, finish_reason="stop",
                                               pooled=out.pooled))
                continue
            new_ids = list(out.new_token_ids)
            choice.track_version(weight_version, len(new_ids))
            step = choice.detokenizer.add(new_ids, ends_on_stop_token=out.stopped_on_token)
            lps, prompt_lps = (converted or {}).get((out.request_id, out.index)) or ([], None)
            update = ChoiceUpdate(
                index=choice.outbox_index,
                text=step.text,
                token_ids=new_ids,
                logprobs=lps,
                prompt_logprobs=prompt_lps,
            )
            if step.stop_reason is not None:
                update.finish_reason = "stop"
                update.stop_reason = step.stop_reason
                if not out.finished:  # this choice only: its siblings go on
                    self._stop(req, choice.index, "stop")
            elif out.finished:
                update.text += choice.detokenizer.flush()
                update.finish_reason = out.finish_reason or "stop"
                update.stop_reason = out.stop_reason
            if update.finish_reason is not None:
                update.weight_versions = choice.version_spans()
                update.timing = timings[i] if timings else None
            interval = state.params.stream_interval
            if interval is not None and interval > 1:
                gathered = choice.gather(update, interval)
                if gathered is None:
                    continue
                update = gathered
            state.outbox.push(update)

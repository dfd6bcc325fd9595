"""The tokenizer actor: prompts in, detokenized deltas out.

Two loops share the actor:
- submissions: render (chat templates) and tokenize prompts in a worker thread, check them
  against the context, and admit one engine request per prompt, with the request's n choices,
  to the engine actor; every request waiting at that moment goes in the same worker-thread
  call (actors.runtime.prompt_prep), so a burst reaches the engine together;
- batches: turn each engine step's token ids into text with each choice's incremental
  detokenizer (stop strings included) and push the result into the request's Outbox.

Channel bounds (capacity = the admission capacity, in engine sequences):
- submit channel (HTTP -> here), size `capacity`: a request is submitted only while it holds
  at least one admission slot and is submitted once, so at most `capacity` are in it;
- admit channel (here -> engine actor), size `capacity`: one message per prompt, whose n choices
  hold n slots until they retire, which happens after the engine actor has read its message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import trio

from actors.messages import RequestOutput
from actors.runtime.failures import ClientGone, PrepareFailed, RowRefused
from actors.errors import RequestRefused
from actors.runtime import faults
from actors.runtime.burst import Arrivals
from actors.text.detokenizer import IncrementalDetokenizer, TokenTexts
from actors.runtime.outbox import ChoiceUpdate, TokenLogprob
from actors.runtime.prompt_bounds import PromptCharBound
from actors.runtime.prompt_prep import PromptPreparer
from actors.runtime.request import (
    Choice,
    EngineRequest,
    Registry,
    RequestState,
)
from actors.runtime.engine_actor import EngineActor

log = logging.getLogger("actors.runtime.tokenizer")

# Requests prepared in one trip to the worker thread, at most: a burst's prompts reach the
# engine together, and the requests behind a trip wait for at most this many renders.
PREPARE_BATCH = 32


class TokenizerActor:
    def __init__(
        self,
        tokenizer: Any,
        registry: Registry,
        engine: EngineActor,
        submit_recv: trio.MemoryReceiveChannel[RequestState],
        admit_send: trio.MemorySendChannel[EngineRequest],
        batch_recv: trio.MemoryReceiveChannel[tuple[RequestOutput, ...]],
        *,
        vocab_size: int,
        arrivals: Arrivals | None = None,
    ) -> None:
        """`arrivals`: settled here for every prompt that will never reach the engine."""
        self._arrivals = arrivals
        self._tokenizer = tokenizer  # a transformers PreTrainedTokenizerFast
        self._backend = tokenizer.backend_tokenizer  # the Rust tokenizers.Tokenizer
        self._registry = registry
        self._engine = engine
        self._submit_recv = submit_recv
        self._admit_send = admit_send
        self._batch_recv = batch_recv
        self._vocab_size = vocab_size
        self._limiter = trio.CapacityLimiter(1)
        # Logprob token texts, decoded here off the event loop; the HTTP side reads them.
        self.token_texts = TokenTexts(self._backend, vocab_size)
        self.prompt_bound = PromptCharBound(self._backend)
        self._preparer = PromptPreparer(self._backend, self.prompt_bound, vocab_size)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._submissions)
            nursery.start_soon(self._batches)
            task_status.started()

    # -- submissions -----------------------------------------------------------------
    async def _submissions(self) -> None:
        async with self._submit_recv, self._admit_send:
            async for state in self._submit_recv:
                states = [state]
                # Whatever else is waiting (a burst) is prepared in the same trip to the
                # worker thread and admitted together: the engine actor receives it as one.
                while len(states) < PREPARE_BATCH:
                    try:
                        states.append(self._submit_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._admit(states)

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
                self._admit_send.send_nowait(req)
            state.note_retired()

    def _make_engine_requests(self, state: RequestState) -> None:
        """One engine request per prompt carrying all n choices: the engine runs the prompt
        once and forks the rest from it, sharing its KV blocks."""
        params = state.params
        n = params.n
        for p, result in enumerate(state.prompt_results):
            room = state.max_model_len - len(result.token_ids)
            max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
            req = EngineRequest(
                engine_id=f"{state.request_id}-{p}",
                prompt_index=p,
                params=replace(params, max_tokens=max_tokens),
                prompt_token_ids=result.token_ids,
                admitted_at=state.arrival,
                pooling=state.pooling,
                encoder_input=state.encoder_input,
            )
            for i in range(n):
                req.choices.append(Choice(
                    index=i,
                    outbox_index=p * n + i,
                    detokenizer=IncrementalDetokenizer(
                        self._backend,
                        prompt_token_ids=result.token_ids,
                        skip_special_tokens=params.skip_special_tokens,
                        stop=params.stop,
                        include_stop_str_in_output=params.include_stop_str_in_output,
                    ),
                ))
            state.engine_requests.append(req)

    # -- engine output -----------------------------------------------------------------
    async def _batches(self) -> None:
        async with self._batch_recv:
            async for outputs in self._batch_recv:
                try:
                    faults.check("tokenizer")
                    converted = None
                    if any(_has_logprobs(out) for out in outputs):
                        # Up to a million entries (a prompt's logprobs): not on the loop.
                        converted = await trio.to_thread.run_sync(self._convert_logprobs,
                                                                  outputs)
                    self._deliver(outputs, converted)
                finally:
                    self._engine.credits.release()

    def _convert_logprobs(self, outputs: tuple[RequestOutput, ...]
                          ) -> dict[tuple[str, int], _Logprobs]:
        """Runs in a worker thread: each output's logprobs as TokenLogprobs, with the text
        of every token they name decoded into token_texts."""
        converted: dict[tuple[str, int], _Logprobs] = {}
        for out in outputs:
            found = self._registry.engine_requests.get(out.request_id)
            if found is None or not _has_logprobs(out):
                continue
            prompt = found[1].prompt_token_ids
            lps = _logprobs(list(out.new_token_ids), out)
            prompt_lps = _prompt_logprobs(prompt, out)
            texts = self.token_texts
            texts.fill(_named_ids(lps, prompt_lps, prompt))
            for lp in lps if prompt_lps is None else (*lps, *prompt_lps):
                if lp is not None:
                    lp.text = texts[lp.token_id]
                    lp.top_texts = tuple(texts[t] for t, _ in lp.top)
            converted[(out.request_id, out.index)] = (lps, prompt_lps)
        return converted

    def _deliver(self, outputs: tuple[RequestOutput, ...],
                 converted: dict[tuple[str, int], _Logprobs] | None = None) -> None:
        for out in outputs:
            found = self._registry.engine_requests.get(out.request_id)
            if found is None:
                continue
            state, req = found
            choice = req.choices[out.index]
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
                choice.finish_reason = "stop"
                if not out.finished:  # this choice only: its siblings go on
                    self._engine.abort_nowait(req, choice.index)
            elif out.finished:
                update.text += choice.detokenizer.flush()
                update.finish_reason = out.finish_reason or "stop"
                update.stop_reason = out.stop_reason
            state.outbox.push(update)


_Logprobs = tuple[list[TokenLogprob], "list[TokenLogprob | None] | None"]


def _has_logprobs(out: RequestOutput) -> bool:
    return bool(out.new_logprobs) or out.prompt_logprobs is not None


def _named_ids(lps: list[TokenLogprob], prompt_lps: list[TokenLogprob | None] | None,
               prompt: list[int]) -> Iterator[int]:
    """Every token id a response may print for these logprobs (an echo prints the prompt's
    first token, which has no logprob)."""
    for lp in lps:
        yield lp.token_id
        yield from (t for t, _ in lp.top)
    if prompt_lps is not None:
        yield from prompt[:1]
        for plp in prompt_lps:
            if plp is not None:
                yield plp.token_id
                yield from (t for t, _ in plp.top)


def _logprobs(token_ids: list[int], out: RequestOutput) -> list[TokenLogprob]:
    lps = out.new_logprobs
    if not lps:
        return []
    return [
        TokenLogprob(tid, float(lp.logprob), list(zip(lp.top_token_ids, lp.top_logprobs)))
        for tid, lp in zip(token_ids, lps)
    ]


def _prompt_logprobs(prompt: list[int], out: RequestOutput
                     ) -> list[TokenLogprob | None] | None:
    lps = out.prompt_logprobs
    if lps is None:
        return None
    return [
        None if lp is None else TokenLogprob(
            tid, float(lp.logprob), list(zip(lp.top_token_ids, lp.top_logprobs)), lp.rank)
        for tid, lp in zip(prompt, lps)
    ]

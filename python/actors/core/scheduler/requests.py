"""Request bookkeeping of the scheduler: which sequences exist and how they come and go.

``RequestBook`` holds the sequences of every live request (waiting and running), their
ids and seeds, and the plan awaiting its result; ``Scheduler`` (policy.py) adds the
policy that decides who computes what each step. Here:

- requests in: ``add_request`` (one Admit, one sequence holding n seats) and ``abort``
  (a request or one choice of it, at any stage);
- results in: ``update`` applies a StepResult, appends tokens, forks the n - 1 siblings
  after the first token (each with its seed from ``actors.core.seeds``) and retires what
  finished;
- the runner is told which sequences to forget (``released_seq_ids`` of the next plan).

A beam-search request (params.use_beam_search) runs its beams through the same paths;
what differs (a beam's result extends, forks or drops beams; aborts end the whole search)
is ``beam_book.BeamBook``'s.

A choice aborted before that fork is remembered and never forked (choice 0 then still
finishes the prompt for the others, and leaves at the fork without an output); every
choice of a request is reported finished exactly once.
"""

from __future__ import annotations

import random
from dataclasses import replace

from actors.core.kv_manager import KVManager
from actors.core.scheduler.beam_book import BeamBook
from actors.core.scheduler.config import SchedulerConfig
from actors.core.scheduler.queues import make_waiting_queue
from actors.core.scheduler.views import output_of
from actors.core.seeds import choice_seed, request_seed
from actors.core.sequence import FinishReason, Sequence, SequenceStatus
from actors.messages import (Admit, Logprobs, Pool, RequestOutput, SampledToken, StepResult,
                             Transcribe)

__all__ = ["RequestBook"]


class RequestBook(BeamBook):
    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting = make_waiting_queue(config.policy)
        self.running: list[Sequence] = []
        self._requests: dict[str, list[Sequence]] = {}  # live sequences per request
        # Choices aborted before they forked (request id -> indices), already reported.
        self._cancelled: dict[str, set[int]] = {}
        self._next_seq_id = 0
        self._rng = random.Random(config.seed)
        self._step_id = 0
        self._in_flight: dict[int, tuple[Sequence, int]] | None = None  # seq_id -> (seq, n)
        self._engine_known: set[int] = set()  # seq ids the engine holds state for
        self._released: list[int] = []
        self._finished: list[tuple[str, int]] = []  # choices ended since the last plan

    # ------------------------------------------------------------------ requests in

    def add_request(self, admit: Admit) -> None:
        """Queues a tokenized request. Raises ValueError for what cannot ever run."""
        self.check_admit(admit)
        params = admit.kind.params
        seq = self._new_sequence(admit.request_id, admit.prompt_token_ids, admit, index=0,
                                 rng_seed=request_seed(params.seed, self._rng))
        if params.use_beam_search:  # its beams fork step by step (beam_book.py)
            self._start_beams(seq)
        else:
            seq.pending_children = params.n - 1
        self._requests[admit.request_id] = [seq]
        self.waiting.push(seq)

    def check_admit(self, admit: Admit) -> None:
        """Raises ValueError for a request that can never run here (what add_request
        refuses), without queueing it: a request held elsewhere first (until its grammar
        compiles) is refused at once, not when it is queued."""
        kind, params = admit.kind, admit.kind.params
        if admit.request_id in self._requests:
            raise ValueError(f"request id {admit.request_id!r} is already in flight")
        n_prompt = len(admit.prompt_token_ids)
        if n_prompt == 0:
            raise ValueError("the prompt must hold at least one token")
        if not isinstance(kind, Pool) and not self.config.causal:
            raise ValueError("this model serves pooling requests only (embeddings)")
        if isinstance(kind, Transcribe) != self.config.encoder_decoder:
            raise ValueError("this model serves transcription requests only"
                             if self.config.encoder_decoder else
                             "this model takes no encoder input (not an encoder-decoder)")
        if isinstance(kind, Transcribe) and params.use_beam_search:
            raise ValueError("beam search is not served for transcription")
        if isinstance(kind, Transcribe) and params.n != 1:
            raise ValueError("a transcription request has exactly one choice (n=1)")
        if isinstance(kind, Pool):  # one choice by construction (POOL_SAMPLING)
            if n_prompt > self.config.max_model_len:  # no output token: the whole context
                raise ValueError(f"the prompt has {n_prompt} tokens; max_model_len is "
                                 f"{self.config.max_model_len}")
        elif n_prompt >= self.config.max_model_len:
            raise ValueError(
                f"the prompt has {n_prompt} tokens; max_model_len={self.config.max_model_len} "
                "leaves no room for an output token"
            )
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.config.max_num_seqs}")

    def abort(self, request_id: str, index: int | None = None) -> list[RequestOutput]:
        """Finishes every sequence of a request (or only choice ``index``) now, freeing
        its blocks. Idempotent; an unknown id or a finished choice is ignored.

        A choice not forked yet (its prompt is still running as choice 0) is reported
        aborted now and skipped at the fork; choice 0 itself keeps computing the prompt
        while any sibling still wants it, and leaves at the fork without an output."""
        if index is None:
            return self._end_request(request_id, FinishReason.ABORT)
        live = self._requests.get(request_id)
        if not live:
            return []
        if live[0].beam is not None:  # one search: a choice cannot end alone
            return self._end_request(request_id, FinishReason.ABORT)
        first = live[0]
        if first.pending_children and 0 <= index <= first.pending_children:
            cancelled = self._cancelled.setdefault(request_id, set())
            if index in cancelled:
                return []
            cancelled.add(index)
            self._finished.append((request_id, index))
            out = replace(output_of(first), index=index, finished=True, finish_reason="abort",
                          stop_reason=None, new_token_ids=(), new_logprobs=None,
                          num_output_tokens=0 if index else first.num_output_tokens)
            if len(cancelled) == first.pending_children + 1:  # nobody wants the prompt
                del self._cancelled[request_id]
                self._remove(first)
                first.finish(FinishReason.ABORT)
                first.pending_children = 0
                self._retire(first)
            return [out]
        seq = next((s for s in live if s.index == index), None)
        if seq is None:
            return []
        self._remove(seq)
        seq.finish(FinishReason.ABORT)
        self._retire(seq)
        return [output_of(seq)]

    def _remove(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)

    def _end_request(self, request_id: str, reason: FinishReason) -> list[RequestOutput]:
        seqs = self._requests.get(request_id)
        if seqs and seqs[0].beam is not None:
            return self._end_beams(request_id, [], reason)
        seqs = self._requests.pop(request_id, None)
        cancelled = self._cancelled.pop(request_id, set())
        if seqs is None:
            return []
        outputs = []
        for seq in seqs:
            self._remove(seq)
            self.kv.free(seq)
            seq.finish(reason)
            self._release(seq)
            out = output_of(seq)
            if seq.index not in cancelled:
                outputs.append(out)
                self._finished.append((request_id, seq.index))
            for i in range(1, seq.pending_children + 1):  # siblings that never started
                if i not in cancelled:
                    outputs.append(replace(out, index=i, num_output_tokens=0))
                    self._finished.append((request_id, i))
            seq.pending_children = 0
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def take_released(self) -> tuple[int, ...]:
        """The sequences to release that no plan has carried yet, handed over now (the
        next plan will not carry them): for a runner state too large to keep until the
        next step that runs anything (an encoder-decoder's cross-attention K/V)."""
        if self._in_flight is not None:
            raise RuntimeError("take_released while a plan awaits its result")
        released, self._released = tuple(self._released), []
        return released

    # ------------------------------------------------------------------ results in

    def update(self, result: StepResult) -> list[RequestOutput]:
        """Applies a step's outcome; returns outputs of sequences that sampled or ended."""
        if self._in_flight is None or result.step_id != self._step_id:
            raise RuntimeError(f"unexpected StepResult for step {result.step_id}")
        in_flight, self._in_flight = self._in_flight, None
        sampled: dict[int, SampledToken] = {t.seq_id: t for t in result.sampled}
        pooled = {p.seq_id: p.data for p in result.pooled}
        for pl in result.prompt_logprobs:
            seq = in_flight[pl.seq_id][0]
            got = seq.prompt_logprobs
            if got is None or seq.status is not SequenceStatus.RUNNING:
                continue
            # Entry j scores prompt token start + j; got holds tokens 1 .. len(got). A
            # recompute after preemption scores some tokens again: keep the first.
            skip = len(got) + 1 - pl.start
            if skip < 0:
                raise RuntimeError(f"prompt logprobs of seq {pl.seq_id} skip tokens")
            got.extend(pl.entries[skip:])
        outputs = []
        refused: list[str] = []  # requests whose row the sampler refused
        for seq, num_new in in_flight.values():
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens += num_new
            self.kv.commit(seq)
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a mid-prompt chunk: nothing drawn
            if seq.pooling is not None:  # its vector: done, blocks back at once
                data = pooled.get(seq.seq_id)
                if data is None:
                    raise RuntimeError(f"step {result.step_id} pooled nothing for seq "
                                       f"{seq.seq_id}")
                seq.finish(FinishReason.STOP)
                self._retire(seq)
                outputs.append(replace(output_of(seq), pooled=data))
                continue
            tok = sampled.get(seq.seq_id)
            if tok is None:
                raise RuntimeError(f"step {result.step_id} drew no token for seq {seq.seq_id}")
            if tok.refused:
                refused.append(seq.request_id)
                continue
            if seq.beam is not None:  # its group decides what it appends (beam_book.py)
                outputs.extend(self._beam_result(seq, tok))
                continue
            if tok.token_id < 0:  # the sampler masked every token: nothing can follow
                seq.finish(FinishReason.STOP)
                new: tuple[int, ...] = ()
            else:
                appended = [tok.token_id]
                done = seq.append_token(tok.token_id)
                for t in tok.forced:  # fast-forward: the rest of a forced run
                    if done:
                        break  # what follows a stop or the length limit is dropped
                    appended.append(t)
                    done = seq.append_token(t)
                new = tuple(appended)
            # Fork before a finished parent gives its blocks back. True: choice 0 itself
            # was aborted before the fork (and reported then).
            if seq.pending_children and self._fork_children(seq):
                seq.finish(FinishReason.ABORT)
                self._retire(seq)
                continue
            if seq.is_finished:
                self._retire(seq)
            prompt_lps = None
            if seq.prompt_logprobs is not None:  # its first token: deliver them, once
                prompt_lps = (None, *seq.prompt_logprobs)
                seq.prompt_logprobs = None
            outputs.append(output_of(seq, new, _logprobs_of(seq, tok) if new else None,
                                     prompt_lps))
        for request_id in dict.fromkeys(refused):
            # Every choice of the request ends: they share the parameters the row had.
            outputs.extend(self._end_request(request_id, FinishReason.ERROR))
        if any(s.is_finished for s in self.running):
            self.running = [s for s in self.running if not s.is_finished]
        return outputs

    # ------------------------------------------------------------------ internals

    def _retire(self, seq: Sequence) -> None:
        """A finished sequence leaves: blocks back to the pool, engine told to forget it."""
        self.kv.free(seq)
        self._release(seq)
        self._finished.append((seq.request_id, seq.index))
        live = self._requests.get(seq.request_id)
        if live is not None:
            live.remove(seq)
            if not live:
                del self._requests[seq.request_id]

    def _release(self, seq: Sequence) -> None:
        if seq.seq_id in self._engine_known:
            self._engine_known.discard(seq.seq_id)
            self._released.append(seq.seq_id)

    def _fork_children(self, parent: Sequence) -> bool:
        """Forks the choices not aborted meanwhile; True if choice 0 itself was."""
        live = self._requests[parent.request_id]
        cancelled = self._cancelled.pop(parent.request_id, set())
        for i in range(1, parent.pending_children + 1):
            if i in cancelled:
                continue
            # Choice 0 holds the request seed (choice_seed(seed, 0) is the seed itself).
            child = self._new_sequence(parent.request_id, parent.prompt_token_ids, parent,
                                       index=i, rng_seed=choice_seed(parent.rng_seed, i))
            child.num_cached_tokens = parent.num_cached_tokens
            self.kv.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
            live.append(child)
        parent.pending_children = 0
        return 0 in cancelled

    def _new_sequence(self, request_id: str, prompt: tuple[int, ...], src: Admit | Sequence,
                      *, index: int, rng_seed: int) -> Sequence:
        seq = Sequence(
            self._next_seq_id,
            request_id,
            prompt,
            src.kind.params,
            max_model_len=self.config.max_model_len,
            eos_token_ids=self.config.eos_token_ids,
            index=index,
            arrival_time=src.arrival_time,
            priority=src.priority,
            rng_seed=rng_seed,
            kind=src.kind,
        )
        seq.suppress = self.config.suppress_tokens  # the model family's rules (hooks.py)
        seq.suppress_first = self.config.begin_suppress_tokens
        self._next_seq_id += 1
        return seq


def _logprobs_of(seq: Sequence, tok: SampledToken) -> tuple[Logprobs, ...] | None:
    if not seq.params.wants_logprobs or tok.logprobs is None:
        return None
    return (tok.logprobs,)

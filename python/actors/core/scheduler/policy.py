"""Scheduler: decides, step by step, which sequences compute which tokens.

One rule (as in vLLM v1): every sequence has num_computed_tokens and num_tokens, and
each step hands out tokens so computed catches up with total, within a token budget
(max_num_batched_tokens) and a sequence cap (max_num_seqs). Decode (1 token),
chunked prefill (a budget-sized piece of a long prompt), prefix-cache hits (computed
from the start) and recompute after preemption all fall out of that rule.

A step:
  1. running sequences, in order, each get min(num_tokens - num_computed, budget);
     when blocks run out, the newest running sequence (priority policy: the lowest
     priority, then newest) is preempted -- blocks freed, num_computed = 0, back to
     the waiting queue -- until the allocation fits. A sequence alone in running is
     never preempted; it waits (it cannot happen when the pool holds max_model_len).
  2. if nobody was preempted, waiting sequences in policy order are admitted while
     budget, seats and blocks last. Admission stops at the first that does not fit
     (head-of-line), so nothing behind it can overtake it forever.

A request with n > 1 first runs as one sequence and reserves n seats; when its prompt
is computed and its first token drawn, n - 1 siblings fork from it (KVManager.fork), each
with its seed from ``actors.core.seeds.choice_seed``. A choice aborted before that fork is
remembered and never forked (choice 0 then still finishes the prompt for the others).

No starvation (FCFS): the oldest running sequence is never a victim while a newer one
runs, so it finishes; head-of-line admission and front-of-queue re-entry then let every
waiting sequence become the oldest. Under the priority policy a steady stream of
higher-priority work can delay lower priorities without bound, as intended.
"""

from __future__ import annotations

import random
from dataclasses import replace

from actors.core.kv_manager import KVManager
from actors.messages import Admit, Logprobs, RequestOutput, SampledToken, ScheduledSeq, StepPlan
from actors.messages import StepResult
from actors.core.scheduler.config import SchedulerConfig, SchedulerStats
from actors.core.scheduler.queues import make_waiting_queue
from actors.core.scheduler.views import new_seq_of, output_of, sampling_row_of
from actors.core.seeds import choice_seed, request_seed
from actors.core.sequence import FinishReason, Sequence, SequenceStatus

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        blocks_per_seq = -(-config.max_model_len // kv.block_size)
        if blocks_per_seq > kv.num_blocks:
            # Otherwise a lone sequence could run out of blocks with nobody to preempt.
            raise ValueError(
                f"the KV cache ({kv.num_blocks} blocks of {kv.block_size}) cannot hold one "
                f"sequence of max_model_len={config.max_model_len}"
            )
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
        self.num_preemptions = 0
        # (request id, choice index) preempted by the latest schedule(), once per
        # preemption (metrics).
        self.last_preempted: list[tuple[str, int]] = []
        # (request id, choice index) the latest schedule() moved from waiting to running
        # (metrics: a queue time ends at the first admission, not at the first token).
        self.last_admitted: list[tuple[str, int]] = []

    # ------------------------------------------------------------------ requests in

    def add_request(self, admit: Admit) -> None:
        """Queues a tokenized request. Raises ValueError for what cannot ever run."""
        params = admit.params
        if admit.request_id in self._requests:
            raise ValueError(f"request id {admit.request_id!r} is already in flight")
        n_prompt = len(admit.prompt_token_ids)
        if n_prompt == 0:
            raise ValueError("the prompt must hold at least one token")
        if n_prompt >= self.config.max_model_len:
            raise ValueError(
                f"the prompt has {n_prompt} tokens; max_model_len={self.config.max_model_len} "
                "leaves no room for an output token"
            )
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.config.max_num_seqs}")
        seq = self._new_sequence(admit.request_id, admit.prompt_token_ids, admit, index=0,
                                 rng_seed=request_seed(params.seed, self._rng))
        seq.pending_children = params.n - 1
        self._requests[admit.request_id] = [seq]
        self.waiting.push(seq)

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
        first = live[0]
        if first.pending_children and 0 <= index <= first.pending_children:
            cancelled = self._cancelled.setdefault(request_id, set())
            if index in cancelled:
                return []
            cancelled.add(index)
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
            for i in range(1, seq.pending_children + 1):  # siblings that never started
                if i not in cancelled:
                    outputs.append(replace(out, index=i, num_output_tokens=0))
            seq.pending_children = 0
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ------------------------------------------------------------------ one step

    def schedule(self) -> StepPlan:
        if self._in_flight is not None:
            raise RuntimeError("schedule() called again before update() of the last plan")
        budget = self.config.max_num_batched_tokens
        scheduled: dict[int, tuple[Sequence, int]] = {}
        preempted = False
        self.last_preempted = []
        self.last_admitted = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.can_allocate(seq, num_new):
                victim = self._pick_victim()
                if victim is seq and len(self.running) == 1:
                    break  # alone: wait, keeping its blocks
                j = self.running.index(victim)
                self._preempt(victim)
                preempted = True
                if victim.seq_id in scheduled:
                    budget += scheduled.pop(victim.seq_id)[1]
                if j < i:
                    i -= 1
                if victim is seq:
                    break
            else:
                self.kv.allocate(seq, num_new)
                scheduled[seq.seq_id] = (seq, num_new)
                budget -= num_new
                i += 1
                continue
            if seq.status is SequenceStatus.RUNNING:  # waited, not preempted
                i += 1

        if not preempted:  # admitting right after preempting would only thrash
            budget = self._admit(budget, scheduled)

        return self._plan(scheduled)

    def update(self, result: StepResult) -> list[RequestOutput]:
        """Applies a step's outcome; returns outputs of sequences that sampled or ended."""
        if self._in_flight is None or result.step_id != self._step_id:
            raise RuntimeError(f"unexpected StepResult for step {result.step_id}")
        in_flight, self._in_flight = self._in_flight, None
        sampled: dict[int, SampledToken] = {t.seq_id: t for t in result.sampled}
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
            tok = sampled.get(seq.seq_id)
            if tok is None:
                raise RuntimeError(f"step {result.step_id} drew no token for seq {seq.seq_id}")
            if tok.refused:
                refused.append(seq.request_id)
                continue
            if tok.token_id < 0:  # the sampler masked every token: nothing can follow
                seq.finish(FinishReason.STOP)
                new: tuple[int, ...] = ()
            else:
                seq.append_token(tok.token_id)
                new = (tok.token_id,)
            if seq.pending_children:  # before a finished parent gives its blocks back
                if self._fork_children(seq):  # choice 0 itself was aborted (reported then)
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

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions,
            kv_usage=self.kv.usage(),
            prefix_queried_tokens=self.kv.prefix_queried_tokens,
            prefix_hit_tokens=self.kv.prefix_hit_tokens,
            num_steps=self._step_id,
        )

    # ------------------------------------------------------------------ internals

    def _admit(self, budget: int, scheduled: dict[int, tuple[Sequence, int]]) -> int:
        seats = len(self.running) + sum(s.pending_children for s in self.running)
        while len(self.waiting) and budget > 0:
            seq = self.waiting.peek()
            if seats + 1 + seq.pending_children > self.config.max_num_seqs:
                break
            # A prompt still owing logprobs is computed from position 0 for its logits; its
            # blocks are still published for others.
            hit = 0 if seq.wants_prompt_logprobs else self.kv.match_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.kv.can_allocate(seq, num_new):
                self.kv.free(seq)  # give the hits back; retry next step
                break
            self.kv.allocate(seq, num_new)
            self.waiting.pop()
            self.kv.record_admission(seq, hit)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = hit
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.last_admitted.append((seq.request_id, seq.index))
            scheduled[seq.seq_id] = (seq, num_new)
            budget -= num_new
            seats += 1 + seq.pending_children
        return budget

    def _plan(self, scheduled: dict[int, tuple[Sequence, int]]) -> StepPlan:
        self._step_id += 1
        seqs, new_seqs = [], []
        for seq, num_new in scheduled.values():
            start = seq.num_computed_tokens
            end = start + num_new
            if seq.seq_id not in self._engine_known:
                self._engine_known.add(seq.seq_id)
                new_seqs.append(new_seq_of(seq))
            seqs.append(
                ScheduledSeq(
                    seq_id=seq.seq_id,
                    token_ids=tuple(seq.token_slice(start, end)),
                    start_pos=start,
                    block_table=tuple(seq.block_ids),
                    sample=sampling_row_of(seq) if end == seq.num_tokens else None,
                    prompt_logprobs=(seq.params.prompt_logprobs
                                     if seq.wants_prompt_logprobs else None),
                )
            )
        released, self._released = tuple(self._released), []
        self._in_flight = scheduled if scheduled else None  # an empty plan needs no result
        return StepPlan(self._step_id, tuple(seqs), tuple(new_seqs), released)

    def _pick_victim(self) -> Sequence:
        if self.config.policy == "priority":
            return max(self.running, key=lambda s: (s.priority, s.arrival_time, s.seq_id))
        return max(self.running, key=lambda s: (s.arrival_time, s.seq_id))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.last_preempted.append((seq.request_id, seq.index))
        self._release(seq)
        self.waiting.push_front(seq)

    def _retire(self, seq: Sequence) -> None:
        """A finished sequence leaves: blocks back to the pool, engine told to forget it."""
        self.kv.free(seq)
        self._release(seq)
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
        params = src.params
        seq = Sequence(
            self._next_seq_id,
            request_id,
            prompt,
            params,
            max_model_len=self.config.max_model_len,
            eos_token_ids=self.config.eos_token_ids,
            index=index,
            arrival_time=src.arrival_time,
            priority=src.priority,
            rng_seed=rng_seed,
        )
        self._next_seq_id += 1
        return seq


def _logprobs_of(seq: Sequence, tok: SampledToken) -> tuple[Logprobs, ...] | None:
    if seq.params.logprobs is None or tok.logprobs is None:
        return None
    return (tok.logprobs,)

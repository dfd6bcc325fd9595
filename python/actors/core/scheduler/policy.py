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
is computed and its first token drawn, n - 1 siblings fork from it (KVManager.fork).
A beam search holds its width in seats; its beams fork and end each step (beam_book.py),
and a beam that has sampled waits, taking nothing from the step, for its group's others.
Requests coming and going (add, abort, results, forks, seeds) are the bookkeeping of
``requests.RequestBook``, which this class extends with the policy.

No starvation (FCFS): the oldest running sequence is never a victim while a newer one
runs, so it finishes; head-of-line admission and front-of-queue re-entry then let every
waiting sequence become the oldest. Under the priority policy a steady stream of
higher-priority work can delay lower priorities without bound, as intended.
"""

from __future__ import annotations

from actors.core.kv_manager import KVManager
from actors.core.scheduler.config import SchedulerConfig, SchedulerStats
from actors.core.scheduler.requests import RequestBook
from actors.core.scheduler.views import new_seq_of, sampling_row_of
from actors.core.sequence import Sequence, SequenceStatus
from actors.messages import ScheduledSeq, StepPlan

__all__ = ["Scheduler"]


class Scheduler(RequestBook):
    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        # Over every KV cache group: a sliding group's share is bounded by its window.
        blocks_per_seq = kv.max_blocks_per_seq(config.max_model_len,
                                               config.max_num_batched_tokens)
        if blocks_per_seq > kv.num_blocks:
            # Otherwise a lone sequence could run out of blocks with nobody to preempt.
            raise ValueError(
                f"the KV cache ({kv.num_blocks} blocks of {kv.block_size}) cannot hold one "
                f"sequence of max_model_len={config.max_model_len}"
            )
        super().__init__(config, kv)
        self.num_preemptions = 0
        # (request id, choice index) preempted by the latest schedule(), once per
        # preemption (metrics).
        self.last_preempted: list[tuple[str, int]] = []
        # (request id, choice index) the latest schedule() moved from waiting to running
        # (metrics: a queue time ends at the first admission, not at the first token).
        self.last_admitted: list[tuple[str, int]] = []

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
            if num_new == 0:  # a beam waiting for its group's other beams
                i += 1
                continue
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
        # A beam search holds its width in seats while any of its beams runs.
        groups = {id(s.beam): s.beam for s in self.running if s.beam is not None}
        seats = (sum(1 + s.pending_children for s in self.running if s.beam is None)
                 + sum(g.width for g in groups.values()))
        while len(self.waiting) and budget > 0:
            seq = self.waiting.peek()
            need = 1 + seq.pending_children
            if seq.beam is not None:
                need = 0 if id(seq.beam) in groups else seq.beam.width
            if seats + need > self.config.max_num_seqs:
                break
            # A prompt still owing logprobs is computed from position 0 for its logits; its
            # blocks are still published for others.
            causal = self.config.causal
            hit = 0 if seq.needs_every_row(causal) else self.kv.match_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not causal and num_new < seq.num_tokens:
                self.kv.free(seq)
                break  # an encoder's prompt runs whole: it waits for a step with room
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
            seats += need
            if seq.beam is not None:
                groups[id(seq.beam)] = seq.beam
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
                    group_block_tables=tuple(tuple(t) for t in seq.group_block_ids),
                    sample=(sampling_row_of(seq)
                            if end == seq.num_tokens and seq.pooling is None else None),
                    prompt_logprobs=(seq.params.prompt_logprobs
                                     if seq.wants_prompt_logprobs else None),
                )
            )
        if not scheduled:  # never reaches the runner: its releases wait for the next plan
            self._in_flight = None  # and it needs no result
            return StepPlan(self._step_id, (), (), ())
        released, self._released = tuple(self._released), []
        finished, self._finished = tuple(self._finished), []
        self._in_flight = scheduled
        return StepPlan(self._step_id, tuple(seqs), tuple(new_seqs), released, finished)

    def _pick_victim(self) -> Sequence:
        if self.config.policy == "priority":
            return max(self.running, key=lambda s: (s.priority, s.arrival_time, s.seq_id))
        return max(self.running, key=lambda s: (s.arrival_time, s.seq_id))

    def _preempt(self, seq: Sequence) -> None:
        if seq.beam is not None:  # it reports again once recomputed
            seq.beam.pending.pop(seq.seq_id, None)
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.last_preempted.append((seq.request_id, seq.index))
        self._release(seq)
        self.waiting.push_front(seq)



"""Beam search as sequences: the scheduler's side of a BeamGroup (beam_group.py).

A beam request enters as one sequence (its prompt) that holds ``width`` seats. Every beam
is an ordinary running sequence: the scheduler batches, chunks, preempts and recomputes it
like any other, and its row is a greedy one asking for the 2 * width best logprobs. When a
beam's step has sampled it waits (nothing to compute, so no seat in the batch and no
token budget) until every live beam of its group has reported; then, in that step's
update, the group picks the next beams and this module applies the choice:

- a beam chosen once goes on as the same sequence (its token appended);
- a beam chosen k > 1 times forks k - 1 sequences first, each sharing the parent's full
  computed blocks (``KVManager.fork`` at the fork point) and recomputing the partial last
  block and the new token itself, so no KV is ever copied and shared blocks stay
  read-only;
- a beam not chosen is freed at once (blocks back to the pool, the runner told).

Nothing is reported while the search runs; when it ends the ``width`` best hypotheses are
reported as choices 0 .. width - 1, each finished, best first. Beams carry the indexes of
the seats they hold (0 .. width - 1, reused), so the per-choice bookkeeping downstream
(metrics, aborts) sees indexes it knows. Aborting any choice of a beam request ends all
of it (the choices are ranks of one search, not independent streams).

Weak spot: beams of a group that reported hold their blocks while waiting for a sibling
that was preempted; under heavy memory pressure the sibling comes back only once other
requests free blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.core.scheduler.beam_group import BeamGroup, Hypothesis
from actors.core.sequence import FinishReason, Sequence, SequenceStatus
from actors.messages import RequestOutput, SampledToken

if TYPE_CHECKING:
    from actors.core.kv_manager import KVManager
    from actors.core.scheduler.queues import WaitingQueue

__all__ = ["BeamBook"]


class BeamBook:
    """The beam verbs of RequestBook (which provides the attributes typed below)."""

    kv: KVManager
    running: list[Sequence]
    waiting: WaitingQueue
    _requests: dict[str, list[Sequence]]
    _finished: list[tuple[str, int]]

    def _start_beams(self, seq: Sequence) -> None:
        p = seq.params
        limit = min(seq.max_output_tokens, seq.max_model_len - seq.num_prompt_tokens)
        seq.beam = BeamGroup(
            seq.request_id, p.n, length_penalty=float(p.length_penalty),
            eos_token_ids=frozenset() if p.ignore_eos else seq.eos_token_ids,
            include_stop=p.include_stop_str_in_output, num_logprobs=p.logprobs,
            max_generated=limit)
        seq.beam.cum[seq.seq_id] = 0.0

    def _beam_result(self, seq: Sequence, tok: SampledToken) -> list[RequestOutput]:
        """A beam sampled: record its candidates; once the group is complete, step it."""
        group = seq.beam
        assert group is not None
        if tok.logprobs is None:
            raise RuntimeError(f"beam sequence {seq.seq_id} came back without logprobs")
        live = self._requests[seq.request_id]
        if not group.report(seq.seq_id, tok.logprobs, len(live)):
            return []
        exts = group.extend([(s.seq_id, tuple(s.output_token_ids)) for s in live])
        if not exts:
            return self._end_beams(seq.request_id, group.results())
        chosen: dict[int, list] = {}
        for e in exts:
            chosen.setdefault(e.parent, []).append(e)
        parents = list(live)
        free_seats = [i for i in range(group.width)
                      if i not in {s.index for b, s in enumerate(parents) if b in chosen}]
        for b, parent in enumerate(parents):
            mine = chosen.get(b)
            if mine is None:
                self._drop_beam(parent)
                continue
            for e in mine[1:]:
                self._fork_beam(parent, e, free_seats.pop(0))
            group.adopt(parent.seq_id, parent.seq_id, mine[0])
            parent.output_token_ids.append(mine[0].token_id)
        return []

    def _fork_beam(self, parent: Sequence, ext, seat: int) -> None:
        child = self._new_sequence(parent.request_id, parent.prompt_token_ids, parent,
                                   index=seat, rng_seed=parent.rng_seed)
        child.beam = parent.beam
        child.num_cached_tokens = parent.num_cached_tokens
        child.output_token_ids = [*parent.output_token_ids, ext.token_id]
        child.beam.adopt(child.seq_id, parent.seq_id, ext)
        self._requests[parent.request_id].append(child)
        if parent.status is SequenceStatus.RUNNING:
            self.kv.fork(parent, child, upto=parent.num_computed_tokens)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        else:  # preempted while its siblings ran: recomputes when it comes back
            child.status = SequenceStatus.PREEMPTED
            self.waiting.push_front(child)

    def _drop_beam(self, seq: Sequence) -> None:
        self._remove(seq)
        self.kv.free(seq)
        seq.finish(FinishReason.ABORT)
        self._release(seq)
        seq.beam.forget(seq.seq_id)
        self._requests[seq.request_id].remove(seq)

    def _end_beams(self, request_id: str, hyps: list[Hypothesis],
                   reason: FinishReason | None = None) -> list[RequestOutput]:
        """Frees every live beam and reports the choices: the hypotheses, best first, or
        (``reason``: an abort or error) none."""
        live = self._requests.pop(request_id)
        first = min(live, key=lambda s: s.seq_id)
        for seq in live:
            self._remove(seq)
            self.kv.free(seq)
            seq.finish(reason or FinishReason.STOP)
            self._release(seq)
        width = first.params.n
        outputs = []
        for i in range(width):
            self._finished.append((request_id, i))
            hyp = hyps[i] if i < len(hyps) else None
            tokens = () if hyp is None else hyp.token_ids
            finish = reason.value if reason is not None else (
                "length" if hyp is None else hyp.finish_reason)
            ends_on_eos = hyp is not None and bool(tokens) and hyp.stop_reason is not None \
                and tokens[-1] == hyp.stop_reason
            outputs.append(RequestOutput(
                request_id=request_id, index=i, new_token_ids=tokens,
                new_logprobs=(hyp.logprobs if hyp is not None and first.params.logprobs
                              is not None and tokens else None),
                finished=True, finish_reason=finish,
                stop_reason=None if hyp is None else hyp.stop_reason,
                num_prompt_tokens=first.num_prompt_tokens,
                num_cached_tokens=first.num_cached_tokens, num_output_tokens=len(tokens),
                stopped_on_token=ends_on_eos))
        return outputs

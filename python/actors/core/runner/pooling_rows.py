"""The runner's pooling sequences (``Pool`` kinds): each one's spec and PoolState across
the chunks of its prompt, the token types a cross-encoder's text pairs need, and the
vector each sequence answers when its prompt has run.

    rows = PoolingRows()
    rows.add(seq_id, spec)                              # NewSeq of a Pool kind
    types = rows.token_types(plan, prompt_of)           # [T] or None: BERT's pair types
    out = rows.outputs(plan, batch_idx, query_start, hidden, model, prompt_len)

A spec with ``classify`` answers the model's classification head (``model.classifier``,
actors.models.classifier) over the pooled row, then its activation; any other, the pooled
row cut to ``dimensions`` and normalized (actors.models.pooling.finish). The server only
sends ``classify`` to a classifier; a model without a head answers the pooled row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from actors.messages import PooledOutput, StepPlan
from actors.models.classifier import activate
from actors.models.pooling import PoolState, finish
from actors.params.pooling import PoolingSpec

__all__ = ["PoolingRows"]


class PoolingRows:
    def __init__(self) -> None:
        self._pools: dict[int, tuple[PoolingSpec, PoolState]] = {}
        self._paired = 0  # sequences whose spec has pair_sep: 0 keeps steps bare

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._pools

    def __bool__(self) -> bool:
        return bool(self._pools)

    def add(self, seq_id: int, spec: PoolingSpec) -> None:
        self._pools[seq_id] = (spec, PoolState(spec.pooling_type))
        self._paired += spec.pair_sep is not None

    def release(self, seq_id: int) -> None:
        entry = self._pools.pop(seq_id, None)
        if entry is not None:
            self._paired -= entry[0].pair_sep is not None

    def token_types(self, plan: StepPlan, prompt_of: Callable[[int], np.ndarray]
                    ) -> torch.Tensor | None:
        """Token type per row of the step: 1 after the first separator of a pair's
        prompt, else 0; None when no sequence of the step is a pair."""
        if not self._paired:
            return None
        parts = []
        for s in plan.seqs:
            entry = self._pools.get(s.seq_id)
            n = len(s.token_ids)
            if entry is None or entry[0].pair_sep is None:
                parts.append(np.zeros(n, dtype=np.int64))
                continue
            prompt = prompt_of(s.seq_id)
            seps = np.cumsum(prompt == entry[0].pair_sep)
            after = np.concatenate(([0], seps[:-1])) > 0  # a separator strictly before
            parts.append(after[s.start_pos: s.start_pos + n].astype(np.int64))
        return torch.from_numpy(np.concatenate(parts))

    def outputs(self, plan: StepPlan, batch_idx: list[int], query_start: np.ndarray,
                hidden: torch.Tensor, model: torch.nn.Module,
                prompt_len: Callable[[int], int]) -> tuple[PooledOutput, ...]:
        """Feeds each pooling sequence's rows (final hidden states) to its PoolState; a
        sequence whose prompt this chunk ends gets its vector (float32 bytes)."""
        out = []
        for i in batch_idx:
            s = plan.seqs[i]
            spec, state = self._pools[s.seq_id]
            lo = int(query_start[i])
            state.add(hidden[lo: lo + len(s.token_ids)], s.start_pos)
            if s.start_pos + len(s.token_ids) < prompt_len(s.seq_id):
                continue  # more chunks to come
            self.release(s.seq_id)
            head = getattr(model, "classifier", None)
            if spec.classify and head is not None:
                vec = activate(head(state.result()), spec.activation)
            else:
                vec = finish(state.result(), spec.dimensions, spec.normalize)
            out.append(PooledOutput(s.seq_id, vec.numpy().astype("<f4").tobytes()))
        return tuple(out)

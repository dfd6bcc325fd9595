"""Prompt logprobs: the logprob, rank and top-k of each prompt token a step's rows predict.

Row p of a sequence (a position below prompt_len - 1) scores prompt token p + 1. Logits are
made PROMPT_LOGPROB_ROWS rows at a time, log-softmaxed in fp32, and only the gathered
numbers are kept, so a long chunk never holds its whole [rows, vocab] logits at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from actors.messages import Logprobs, PromptLogprobs, StepPlan

__all__ = ["PROMPT_LOGPROB_ROWS", "score_prompts"]

# Prompt-logprob rows go through the LM head this many at a time: a whole 2048-row chunk
# times a 49152-token vocabulary would be 400 MB of fp32 logits.
PROMPT_LOGPROB_ROWS = 256


def score_prompts(model: Any, vocab_size: int, plan: StepPlan, batch_idx: list[int],
                  query_start: np.ndarray, hidden: torch.Tensor,
                  prompt_of: Callable[[int], np.ndarray]) -> tuple[PromptLogprobs, ...]:
    """Scores the prompt tokens the rows of the given sequences predict.

    Row p (a position in [start_pos, start_pos + n) below prompt_len - 1) yields the
    logprob of prompt token p + 1, its rank and the top-k. Logits are made
    PROMPT_LOGPROB_ROWS rows at a time, log-softmaxed in fp32, and only the gathered
    numbers are kept.
    """
    rows: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    spans: list[tuple[int, int, int, int]] = []  # (seq_id, first token, count, top-k)
    for i in batch_idx:
        s = plan.seqs[i]
        prompt = prompt_of(s.seq_id)
        lo, hi = s.start_pos, min(s.start_pos + len(s.token_ids), len(prompt) - 1)
        if hi <= lo:
            continue
        first_row = int(query_start[i])
        rows.append(np.arange(first_row, first_row + hi - lo, dtype=np.int64))
        targets.append(prompt[lo + 1: hi + 1].astype(np.int64))
        k = int(s.prompt_logprobs or 0)  # validated; -1: the whole vocabulary
        spans.append((s.seq_id, lo + 1, hi - lo, vocab_size if k < 0 else k))
    if not spans:
        return ()
    all_rows = torch.from_numpy(np.concatenate(rows))
    all_targets = torch.from_numpy(np.concatenate(targets))
    k = min(max(sp[3] for sp in spans), vocab_size)
    tok_lp, ranks, top_ids, top_lp = [], [], [], []
    for b in range(0, len(all_rows), PROMPT_LOGPROB_ROWS):
        r = all_rows[b: b + PROMPT_LOGPROB_ROWS]
        t = all_targets[b: b + PROMPT_LOGPROB_ROWS].unsqueeze(1)
        lp = torch.log_softmax(model.compute_logits(hidden.index_select(0, r)).float(),
                                   dim=-1)
        chosen = lp.gather(1, t)
        tok_lp.append(chosen.squeeze(1))
        ranks.append((lp >= chosen).sum(dim=1))
        if k:
            v, ix = lp.topk(k, dim=1)
            top_lp.append(v)
            top_ids.append(ix)
    lp_all = torch.cat(tok_lp).tolist()
    rank_all = torch.cat(ranks).tolist()
    ids_all = torch.cat(top_ids).tolist() if k else None
    vals_all = torch.cat(top_lp).tolist() if k else None
    out = []
    at = 0
    for seq_id, start, count, kk in spans:
        entries = []
        for j in range(at, at + count):
            entries.append(Logprobs(
                    logprob=lp_all[j],
                    top_token_ids=tuple(ids_all[j][:kk]) if kk else (),
                    top_logprobs=tuple(vals_all[j][:kk]) if kk else (),
                    rank=rank_all[j],
            ))
        at += count
        out.append(PromptLogprobs(seq_id=seq_id, start=start, entries=tuple(entries)))
    return tuple(out)

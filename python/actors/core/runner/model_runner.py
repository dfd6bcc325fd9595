"""ModelRunner: executes a StepPlan on the model and the core, returns a StepResult.

The runner owns what the engine side keeps per sequence (prompt and output tokens for
penalties, logit bias, allowed tokens) and the paged KV caches. One step:

    StepPlan --flatten--> input_ids [T], positions [T], AttentionPlan (once per step)
             --model-->   logits for the rows that sample (none: a step of mid-prompt chunks)
             --sampler--> one token per sampling sequence --> StepResult

One core call samples every row; when the core refuses the batch, the rows are drawn one
by one and only the refused rows come back as ``SampledToken(refused=True)``.

The flattened batch of a step (T tokens in all):

    rows:   | seq 0 new tokens | seq 1 new tokens | ... |
    query_start[s] .. query_start[s+1]  = the rows of sequence s
    seq_lens[s] = start_pos + number of new tokens (its whole context)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

import llmcore
from actors.messages import Logprobs, NewSeq, PromptLogprobs, SampledToken, SamplingRow
from actors.messages import StepPlan, StepResult

__all__ = ["ModelRunner", "kv_bytes_per_block"]

log = logging.getLogger("actors.core.runner.model_runner")

# What building a row's int32/float32 columns or the core's own checks raise for a value
# the sampler cannot take: the step goes on without that row.
_REFUSED = (ValueError, OverflowError, TypeError)
_Draw = tuple[int, "Logprobs | None"]  # (token id, its logprobs when asked for)

# Prompt-logprob rows go through the LM head this many at a time: a whole 2048-row chunk
# times a 49152-token vocabulary would be 400 MB of fp32 logits.
PROMPT_LOGPROB_ROWS = 256


def kv_bytes_per_block(num_layers: int, num_kv_heads: int, head_size: int, block_size: int,
                       dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_size * block_size * elem


@dataclass(slots=True)
class _SeqState:
    """What the engine side remembers of one sequence between steps."""

    prompt: np.ndarray  # int32
    outputs: list[int]
    logit_bias: tuple[tuple[int, float], ...]
    allowed_mask: np.ndarray | None  # int32 bitmask row, or None
    output_array: np.ndarray | None = field(default=None)  # cache of outputs as int32

    def outputs_i32(self) -> np.ndarray:
        if self.output_array is None or len(self.output_array) != len(self.outputs):
            self.output_array = np.asarray(self.outputs, dtype=np.int32)
        return self.output_array


class _PagedAttention:
    """The model's attention seam for one step: store new K/V, attend over the cache."""

    __slots__ = ("plan", "k_caches", "v_caches", "scale", "windows")

    def __init__(self, plan, k_caches, v_caches, scale: float, windows: list[int]) -> None:
        self.plan = plan
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.windows = windows

    def attn(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        llmcore.kv_store(self.plan, k, v, kc, vc)
        out = torch.empty_like(q)
        llmcore.paged_attention(self.plan, q, kc, vc, out, self.scale,
                                sliding_window=self.windows[layer])
        return out


class ModelRunner:
    def __init__(self, model, num_layers: int, num_kv_heads: int, head_size: int,
                 vocab_size: int, num_blocks: int, block_size: int, dtype: torch.dtype,
                 sliding_windows: tuple[int | None, ...] = ()) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_size)
        # Per layer; 0 = full causal attention.
        self.windows = [int(w or 0) for w in sliding_windows] or [0] * num_layers
        shape = (num_blocks, num_kv_heads, block_size, head_size)
        self.k_caches = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self._seqs: dict[int, _SeqState] = {}
        self._bitmask_words = (vocab_size + 31) // 32

    # ------------------------------------------------------------------ sequences

    def _add(self, ns: NewSeq) -> None:
        mask = None
        if ns.allowed_token_ids is not None:
            mask = np.zeros(self._bitmask_words, dtype=np.uint32)
            ids = np.asarray(ns.allowed_token_ids, dtype=np.int64)
            np.bitwise_or.at(mask, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
            mask = mask.view(np.int32)
        self._seqs[ns.seq_id] = _SeqState(
            prompt=np.asarray(ns.prompt_token_ids, dtype=np.int32),
            outputs=list(ns.output_token_ids),
            logit_bias=ns.logit_bias,
            allowed_mask=mask,
        )

    def num_sequences(self) -> int:
        return len(self._seqs)

    # ------------------------------------------------------------------ one step

    def execute(self, plan: StepPlan) -> StepResult:
        for sid in plan.released_seq_ids:
            self._seqs.pop(sid, None)
        for ns in plan.new_seqs:
            self._add(ns)
        if not plan.seqs:
            return StepResult(step_id=plan.step_id, sampled=())

        bs = self.block_size
        num_seqs = len(plan.seqs)
        max_blocks = max(len(s.block_table) for s in plan.seqs)
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        query_start = np.zeros(num_seqs + 1, dtype=np.int32)
        seq_lens = np.empty(num_seqs, dtype=np.int32)
        token_ids: list[int] = []
        positions: list[np.ndarray] = []
        sampling: list[int] = []  # batch indices of sequences that sample
        prompt_rows: list[int] = []  # batch indices of sequences scoring prompt tokens
        for i, s in enumerate(plan.seqs):
            n = len(s.token_ids)
            token_ids.extend(s.token_ids)
            positions.append(np.arange(s.start_pos, s.start_pos + n, dtype=np.int64))
            query_start[i + 1] = query_start[i] + n
            seq_lens[i] = s.start_pos + n
            block_tables[i, : len(s.block_table)] = s.block_table
            if s.sample is not None:
                sampling.append(i)
            if s.prompt_logprobs is not None:
                prompt_rows.append(i)
        pos = np.concatenate(positions)
        owner = np.repeat(np.arange(num_seqs), np.diff(query_start))
        slot_mapping = block_tables[owner, pos // bs].astype(np.int64) * bs + pos % bs

        attn_plan = llmcore.AttentionPlan(query_start, seq_lens, block_tables, slot_mapping,
                                          num_blocks=self.num_blocks)
        seam = _PagedAttention(attn_plan, self.k_caches, self.v_caches, self.scale,
                               self.windows)
        logits_rows = torch.from_numpy(query_start[1:][sampling].astype(np.int64) - 1)
        ids_t = torch.tensor(token_ids, dtype=torch.long)
        prompt_lps: tuple[PromptLogprobs, ...] = ()
        with torch.inference_mode():
            if not sampling and not prompt_rows:
                # Only mid-prompt chunks (a prompt longer than the token budget): the KV
                # is the whole result, no row reaches the LM head.
                self.model.hidden_states(ids_t, torch.from_numpy(pos), seam)
                return StepResult(step_id=plan.step_id, sampled=())
            if not prompt_rows:  # the common step: logits for the sampling rows only
                logits = self.model.forward(ids_t, torch.from_numpy(pos), seam,
                                            logits_indices=logits_rows)
            else:
                hidden = self.model.hidden_states(ids_t, torch.from_numpy(pos), seam)
                logits = (self.model.compute_logits(hidden.index_select(0, logits_rows))
                          if sampling else None)
                prompt_lps = self._prompt_logprobs(plan, prompt_rows, query_start, hidden)
        if not sampling:
            return StepResult(step_id=plan.step_id, sampled=(), prompt_logprobs=prompt_lps)
        res = self._sample(plan, sampling, logits)
        if prompt_lps:
            res = StepResult(step_id=res.step_id, sampled=res.sampled, prompt_logprobs=prompt_lps)
        return res

    def _prompt_logprobs(self, plan: StepPlan, batch_idx: list[int], query_start: np.ndarray,
                         hidden: torch.Tensor) -> tuple[PromptLogprobs, ...]:
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
            prompt = self._seqs[s.seq_id].prompt
            lo, hi = s.start_pos, min(s.start_pos + len(s.token_ids), len(prompt) - 1)
            if hi <= lo:
                continue
            first_row = int(query_start[i])
            rows.append(np.arange(first_row, first_row + hi - lo, dtype=np.int64))
            targets.append(prompt[lo + 1: hi + 1].astype(np.int64))
            k = int(s.prompt_logprobs or 0)  # validated; -1: the whole vocabulary
            spans.append((s.seq_id, lo + 1, hi - lo, self.vocab_size if k < 0 else k))
        if not spans:
            return ()
        all_rows = torch.from_numpy(np.concatenate(rows))
        all_targets = torch.from_numpy(np.concatenate(targets))
        k = min(max(sp[3] for sp in spans), self.vocab_size)
        tok_lp, ranks, top_ids, top_lp = [], [], [], []
        for b in range(0, len(all_rows), PROMPT_LOGPROB_ROWS):
            r = all_rows[b: b + PROMPT_LOGPROB_ROWS]
            t = all_targets[b: b + PROMPT_LOGPROB_ROWS].unsqueeze(1)
            lp = torch.log_softmax(self.model.compute_logits(hidden.index_select(0, r)).float(),
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

    def _sample(self, plan: StepPlan, sampling: list[int], logits: torch.Tensor) -> StepResult:
        rows = [plan.seqs[i].sample for i in sampling]
        seq_ids = [plan.seqs[i].seq_id for i in sampling]
        states = [self._seqs[sid] for sid in seq_ids]
        try:
            drawn: list[_Draw | None] = list(self._draw(logits, rows, states))
        except _REFUSED:
            # Some row holds a value the core refuses (validation should have caught it):
            # draw row by row so that only those rows fail. A draw depends on its row
            # alone, never on the batch around it, so the others get the same tokens.
            drawn = [self._draw_one(logits, j, rows, states, seq_ids) for j in range(len(rows))]
        sampled = []
        for sid, st, d in zip(seq_ids, states, drawn):
            if d is None:
                sampled.append(SampledToken(seq_id=sid, token_id=llmcore.NO_TOKEN, refused=True))
                continue
            st.outputs.append(d[0])
            sampled.append(SampledToken(seq_id=sid, token_id=d[0], logprobs=d[1]))
        return StepResult(step_id=plan.step_id, sampled=tuple(sampled))

    def _draw_one(self, logits: torch.Tensor, j: int, rows: list[SamplingRow],
                  states: list[_SeqState], seq_ids: list[int]) -> _Draw | None:
        try:
            return self._draw(logits[j: j + 1], rows[j: j + 1], states[j: j + 1])[0]
        except _REFUSED as exc:
            log.warning("the sampler refused the row of sequence %d: %s", seq_ids[j], exc)
            return None

    def _num_top(self, row: SamplingRow) -> int:
        return self.vocab_size if row.num_logprobs < 0 else row.num_logprobs  # -1: all

    def _draw(self, logits: torch.Tensor, rows: list[SamplingRow],
              states: list[_SeqState]) -> list[_Draw]:
        """One core call for these rows (logits' rows, in order); changes no state."""
        n = len(rows)
        f32 = np.float32
        temperature = np.fromiter((r.temperature for r in rows), f32, n)
        top_k = np.fromiter((r.top_k for r in rows), np.int32, n)
        top_p = np.fromiter((r.top_p for r in rows), f32, n)
        min_p = np.fromiter((r.min_p for r in rows), f32, n)
        rep = np.fromiter((r.repetition_penalty for r in rows), f32, n)
        pres = np.fromiter((r.presence_penalty for r in rows), f32, n)
        freq = np.fromiter((r.frequency_penalty for r in rows), f32, n)
        seed = np.fromiter((r.seed for r in rows), np.uint64, n)
        position = np.fromiter((r.position for r in rows), np.int64, n)

        kwargs = {}
        if any(r.uses_penalties for r in rows):
            kwargs["prompt_tokens"] = _csr([st.prompt if r.repetition_penalty != 1.0 else None
                                            for r, st in zip(rows, states)])
            kwargs["output_tokens"] = _csr([st.outputs_i32() if r.uses_penalties else None
                                            for r, st in zip(rows, states)])
        if any(st.logit_bias for st in states):
            kwargs["logit_bias"] = _csr_bias([st.logit_bias for st in states])
        if any(r.banned_token_ids for r in rows):
            kwargs["banned_tokens"] = _csr([np.asarray(r.banned_token_ids, dtype=np.int32)
                                            for r in rows])
        if any(st.allowed_mask is not None for st in states):
            mask = np.zeros((n, self._bitmask_words), dtype=np.int32)
            use = np.zeros(n, dtype=np.int32)
            for j, st in enumerate(states):
                if st.allowed_mask is not None:
                    mask[j] = st.allowed_mask
                    use[j] = 1
            kwargs["allowed_bitmask"] = mask
            kwargs["use_bitmask"] = use
        # Any count up to the vocabulary; the core refuses a row beyond it like any other.
        num_top = max((self._num_top(r) for r in rows if r.want_logprobs), default=0)

        res = llmcore.sample(logits, temperature, top_k, top_p, min_p, rep, pres, freq, seed,
                             position, num_top_logprobs=num_top, **kwargs)
        tokens, logprobs, _ranks, top_tokens, top_logprobs = res
        out: list[_Draw] = []
        for j, r in enumerate(rows):
            lp = None
            if r.want_logprobs:
                k = self._num_top(r)
                lp = Logprobs(
                    logprob=float(logprobs[j]),
                    top_token_ids=tuple(int(t) for t in top_tokens[j, :k]),
                    top_logprobs=tuple(float(x) for x in top_logprobs[j, :k]),
                )
            out.append((int(tokens[j]), lp))
        return out


def _csr(lists: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, tokens) for per-row int32 token lists; None is an empty row."""
    lengths = np.fromiter((0 if x is None else len(x) for x in lists), np.int32, len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    parts = [x for x in lists if x is not None and len(x)]
    tokens = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
    return offsets, tokens


def _csr_bias(biases: list[tuple[tuple[int, float], ...]]):
    offsets = np.zeros(len(biases) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in biases], out=offsets[1:])
    toks = np.fromiter((t for b in biases for t, _ in b), np.int32)
    vals = np.fromiter((v for b in biases for _, v in b), np.float32)
    return offsets, toks, vals

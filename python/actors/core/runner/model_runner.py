"""ModelRunner: executes a StepPlan on the model and the core, returns a StepResult.

The runner owns what the engine side keeps per sequence (prompt and output tokens for
penalties, logit bias, allowed tokens, sampling hooks) and the paged KV caches. One step:

    StepPlan --flatten--> input_ids [T], positions [T], AttentionPlan (once per step)
             --model-->   logits for the rows that sample (none: a step of mid-prompt chunks)
             --sampler--> one token per sampling sequence --> StepResult

Sampling is ``sampler.Sampler``'s. Sampling hooks (logits processors, a token mask: the
seam of constrained decoding) are registered per (request id, choice index) with
``set_sampling_hooks`` before the choice first runs; a sequence picks its hooks up when
it arrives (``NewSeq``) and the registry forgets them when the plan reports the choice
finished (``StepPlan.finished``).

A prompt given as embeddings (``Generate.prompt_embeds``: placeholder token ids) feeds its
rows to the first layer instead of the placeholders' embeddings: a step with any such
position embeds the whole batch's tokens once, then overwrites those rows
(``_inputs_embeds``); a step without pays one dict test.

Structured outputs use the same seam: a ``NewSeq`` whose params carry a ``StructuredSpec``
gets hooks whose token mask is a fresh grammar matcher (``structured_masks``, set by the
engine, builds it from the process's grammar cache and replays a resumed sequence's
outputs into it), registered like any other; each choice gets its own. A ``NewSeq`` with
a reasoning gate (``NewSeq.reasoning``) gets a ``GatedMask`` around that matcher (or
around none, for a thinking budget alone): actors.core.structured.gate.

The flattened batch of a step (T tokens in all):

    rows:   | seq 0 new tokens | seq 1 new tokens | ... |
    query_start[s] .. query_start[s+1]  = the rows of sequence s
    seq_lens[s] = start_pos + number of new tokens (its whole context)

The paged caches follow the KV cache groups (actors.core.kv_groups): ``k_caches`` and
``v_caches`` hold one tensor per slot (one per layer with a single group), and a step
builds one core plan per group from that group's block tables; each layer attends with its
own scale, window and softcap (attention_seams.LayerAttention).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from actors.core.kv_groups import KVGroups
from actors.core.runner.attention_seams import (CrossPagedAttention, EncoderAttention,
                                                LayerAttention, PagedAttention, group_plans)
from actors.core.runner.cross_kv import CrossKVPool
from actors.core.runner.pooling_rows import PoolingRows
from actors.core.runner.prompt_logprobs import score_prompts
from actors.core.runner.sampler import (Sampler, SamplingHooks, SeqState, TokenMask,
                                        allowed_mask_of)
from actors.messages import (Generate, NewSeq, Pool, PooledOutput, PromptLogprobs, SeqRef,
                             StepPlan, StepResult, Transcribe)
from actors.models import lora, row_kernels
from actors.params.encoder import EncoderInput
from actors.params.structured import StructuredSpec

# (spec, the output tokens the sequence already holds) -> the choice's token mask
MaskFactory = Callable[[StructuredSpec, tuple[int, ...]], TokenMask]

__all__ = ["ModelRunner", "SamplingHooks", "kv_bytes_per_block"]

log = logging.getLogger("actors.core.runner")

def kv_bytes_per_block(num_layers: int, num_kv_heads: int, head_size: int, block_size: int,
                       dtype: torch.dtype) -> int:
    """Bytes one block takes across ``num_layers`` layers, K and V (with KV cache groups:
    the group size, ``KVGroups.num_slots``)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_size * block_size * elem


class ModelRunner:
    def __init__(self, model, num_layers: int, num_kv_heads: int, head_size: int,
                 vocab_size: int, num_blocks: int, block_size: int, dtype: torch.dtype,
                 sliding_windows: tuple[int | None, ...] = (),
                 fast_forward: bool = True, kv_groups: KVGroups | None = None,
                 batch_invariant: bool = True) -> None:
        self.model = model
        # Each row's linear kernels chosen by its role (actors.models.row_kernels), so that
        # its result does not depend on the rest of the step; the core's attention gives a
        # row the same bits in any call by itself.
        self.batch_invariant = batch_invariant
        self.vocab_size = vocab_size
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_groups = kv_groups or KVGroups.single(num_layers)
        # Per layer: scale, window (0 = full causal), softcap, KV group and slot.
        self.layers = LayerAttention.of(model, num_layers, head_size, sliding_windows,
                                        self.kv_groups)
        # An encoder keeps no KV: its blocks are the scheduler's bookkeeping only.
        self.causal = bool(getattr(model, "is_causal", True))
        # An encoder-decoder (Whisper): per sequence, every decoder layer's cross-attention
        # K/V, from its encoder input on its first step until it is released (finish,
        # abort, preemption; a resumed sequence brings its input again). Not in the paged
        # cache: a fixed-size slot per sequence (cross_kv.py), in the KV cache's dtype.
        self.encoder_decoder = bool(getattr(model, "is_encoder_decoder", False))
        self._cross = CrossKVPool(num_layers, num_kv_heads, head_size, block_size, dtype)
        self._to_encode: list[tuple[int, EncoderInput]] = []  # Transcribe: (seq id, input)
        # prompt -> the model family's per-sequence sampling hooks (Whisper's timestamp
        # rules), None for a prompt without; set by the engine from the model's hook
        self.family_rules: Callable[[tuple[int, ...]], SamplingHooks | None] | None = None
        self._kv_shape = (num_blocks, num_kv_heads, block_size, head_size)
        self._kv_dtype = dtype
        self.k_caches: list[torch.Tensor] = []
        self.v_caches: list[torch.Tensor] = []
        self.allocate_kv_cache()
        # Pool kinds: the spec and the pooling state across the chunks of the prompt
        self._pools = PoolingRows()
        self._seqs: dict[int, SeqState] = {}
        self.sampler = Sampler(vocab_size, fast_forward=fast_forward)
        self._hooks: dict[SeqRef, SamplingHooks] = {}
        self._num_hooked = 0  # sequences in _seqs with hooks: 0 keeps the hot path bare
        self.structured_masks: MaskFactory | None = None
        # LoRA (--enable-lora): the adapters' slot tensors, which slot each adapter id
        # occupies, and the adapter id of every sequence that runs under one.
        self.lora: lora.LoraStacks | None = None
        self.lora_slots: dict[int, int] = {}
        self._lora_of: dict[int, int] = {}
        # Sequences whose prompt is embedding rows: seq id -> the rows (float32, shared
        # with the kind's array, not copied).
        self._embeds: dict[int, torch.Tensor] = {}

    def allocate_kv_cache(self) -> None:
        """The paged K/V tensors, zeroed (pages come back as they are written)."""
        layers = self.kv_groups.num_slots if self.causal else 0
        self.k_caches = [torch.zeros(self._kv_shape, dtype=self._kv_dtype)
                         for _ in range(layers)]
        self.v_caches = [torch.zeros(self._kv_shape, dtype=self._kv_dtype)
                         for _ in range(layers)]

    def free_kv_cache(self) -> None:
        """Drops the paged K/V tensors (sleep); ``allocate_kv_cache`` brings them back."""
        self.k_caches, self.v_caches = [], []

    # ------------------------------------------------------------------ sequences

    def set_sampling_hooks(self, request_id: str, index: int, hooks: SamplingHooks) -> None:
        """Constrains choice ``index`` of a request from its first draw on (register it
        before the choice first runs); each choice needs its own hooks object."""
        self._hooks[(request_id, index)] = hooks

    def _add(self, ns: NewSeq) -> None:
        mask = None
        if ns.allowed_token_ids is not None:
            mask = allowed_mask_of(ns.allowed_token_ids, self.vocab_size)
        hooks = self._hooks.get((ns.request_id, ns.index)) if self._hooks else None
        if hooks is None and (ns.reasoning is not None or (
                ns.structured is not None and self.structured_masks is not None)):
            try:
                hooks = SamplingHooks(token_mask=self._token_mask(ns),
                                      accepted=len(ns.output_token_ids))
            except Exception as exc:  # noqa: BLE001 - its first draw is refused, not the step
                log.warning("no token mask for %s choice %d: %s", ns.request_id, ns.index, exc)
                hooks = SamplingHooks(failed=f"no token mask: {type(exc).__name__}")
            self._hooks[(ns.request_id, ns.index)] = hooks
        # A sequence that names its allowed tokens (Whisper's language detection: one step
        # among the language tokens) is constrained by them alone, not the family's rules.
        if hooks is None and ns.allowed_token_ids is None and self.family_rules is not None:
            hooks = self.family_rules(ns.prompt_token_ids)
            if hooks is not None:
                self._hooks[(ns.request_id, ns.index)] = hooks
        if hooks is not None:
            self._num_hooked += 1
            # Back after preemption with fewer tokens than the mask took: undo the rest.
            excess = hooks.accepted - len(ns.output_token_ids)
            if excess > 0 and hooks.token_mask is not None:
                try:
                    hooks.token_mask.rollback(excess)
                except Exception as exc:  # noqa: BLE001 - its next draw is refused, not the step
                    log.warning("the token mask of %s choice %d failed to roll back: %s",
                                ns.request_id, ns.index, exc)
                    hooks.failed = f"the token mask's rollback raised {type(exc).__name__}"
                hooks.accepted -= excess
        embeds = ns.kind.prompt_embeds if isinstance(ns.kind, Generate) else None
        self._seqs[ns.seq_id] = SeqState(
            prompt=np.asarray(ns.prompt_token_ids, dtype=np.int32),
            outputs=list(ns.output_token_ids),
            logit_bias=ns.logit_bias,
            allowed_mask=mask,
            hooks=hooks,
            prompt_penalized=embeds is None,  # placeholder ids are no tokens to penalize
        )
        if embeds is not None:
            self._embeds[ns.seq_id] = torch.from_numpy(embeds.data)
        match ns.kind:
            case Generate(lora_id=lora_id) if lora_id:
                self._lora_of[ns.seq_id] = lora_id
            case Pool(spec=spec):
                self._pools.add(ns.seq_id, spec)
            case Transcribe(encoder_input=enc):
                self._to_encode.append((ns.seq_id, enc))

    def _token_mask(self, ns: NewSeq) -> TokenMask:
        """The choice's grammar mask, under its reasoning gate when it has one (the gate
        then feeds the grammar the content of a resumed sequence's outputs)."""
        from actors.core.structured.gate import GatedMask

        gate = ns.reasoning
        grammar = None
        if ns.structured is not None and self.structured_masks is not None:
            grammar = self.structured_masks(ns.structured,
                                            () if gate is not None else ns.output_token_ids)
        if gate is None:
            assert grammar is not None
            return grammar
        mask = GatedMask(gate, grammar)
        mask.replay(ns.output_token_ids)
        return mask

    def _encode_new(self) -> None:
        """Runs the encoder once for every sequence that arrived in this plan, in one
        batch, and keeps each one's cross-attention K/V."""
        todo, self._to_encode = self._to_encode, []
        feats = torch.from_numpy(np.stack([enc.features for _, enc in todo]))
        with torch.inference_mode():
            for (seq_id, _), kv in zip(todo, self.model.cross_kv(self.model.encode(feats))):
                self._cross.add(seq_id, kv)

    def release(self, seq_ids: tuple[int, ...]) -> None:
        """Forgets these sequences now, between steps (as a plan's released_seq_ids)."""
        for sid in seq_ids:
            self._release(sid)

    def reset_cross_kv(self) -> int:
        """Hands the cross-attention pool's memory back when no sequence uses it (bytes)."""
        return self._cross.reset()

    def num_cross_kv(self) -> int:
        """Sequences whose cross-attention K/V the runner holds."""
        return len(self._cross)

    def _release(self, seq_id: int) -> None:
        self._cross.release(seq_id)
        self._pools.release(seq_id)
        self._lora_of.pop(seq_id, None)
        self._embeds.pop(seq_id, None)
        st = self._seqs.pop(seq_id, None)
        if st is not None and st.hooks is not None:
            self._num_hooked -= 1

    def num_sequences(self) -> int:
        return len(self._seqs)

    # ------------------------------------------------------------------ one step

    def execute(self, plan: StepPlan) -> StepResult:
        for sid in plan.released_seq_ids:
            self._release(sid)
        if self._hooks:
            for ref in plan.finished:
                self._hooks.pop(ref, None)
        for ns in plan.new_seqs:
            self._add(ns)
        if self._to_encode:
            self._encode_new()
        if not plan.seqs:
            return StepResult(step_id=plan.step_id, sampled=())

        num_seqs = len(plan.seqs)
        max_blocks = max(len(s.block_table) for s in plan.seqs)
        # [group, seq, block]: every group's table of a sequence has the same length
        block_tables = np.zeros((self.kv_groups.num_groups, num_seqs, max_blocks),
                                dtype=np.int32)
        query_start = np.zeros(num_seqs + 1, dtype=np.int32)
        seq_lens = np.empty(num_seqs, dtype=np.int32)
        token_ids: list[int] = []
        positions: list[np.ndarray] = []
        sampling: list[int] = []  # batch indices of sequences that sample
        prompt_rows: list[int] = []  # batch indices of sequences scoring prompt tokens
        pool_rows: list[int] = []  # batch indices of pooling sequences
        pools = self._pools
        for i, s in enumerate(plan.seqs):
            n = len(s.token_ids)
            token_ids.extend(s.token_ids)
            positions.append(np.arange(s.start_pos, s.start_pos + n, dtype=np.int64))
            query_start[i + 1] = query_start[i] + n
            seq_lens[i] = s.start_pos + n
            block_tables[0, i, : len(s.block_table)] = s.block_table
            for g, table in enumerate(s.group_block_tables, 1):
                block_tables[g, i, : len(table)] = table
            if s.sample is not None:
                sampling.append(i)
            if s.prompt_logprobs is not None:
                prompt_rows.append(i)
            if pools and s.seq_id in pools:
                pool_rows.append(i)
        pos = np.concatenate(positions)
        seam: PagedAttention | EncoderAttention
        if self.causal:
            owner = np.repeat(np.arange(num_seqs), np.diff(query_start))
            plans = group_plans(block_tables, query_start, seq_lens, owner, pos,
                                self.block_size, self.num_blocks)
            if self.encoder_decoder:
                seq_ids = np.fromiter((s.seq_id for s in plan.seqs), np.int64, num_seqs)
                seam = CrossPagedAttention(plans, self.k_caches, self.v_caches, self.layers,
                                           self._cross, seq_ids[owner])
            else:
                seam = PagedAttention(plans, self.k_caches, self.v_caches, self.layers)
        else:
            seam = EncoderAttention(query_start, self.layers.default_scale)
        logits_rows = torch.from_numpy(query_start[1:][sampling].astype(np.int64) - 1)
        ids_t = torch.tensor(token_ids, dtype=torch.long)
        prompt_lps: tuple[PromptLogprobs, ...] = ()
        pooled: tuple[PooledOutput, ...] = ()
        split = None
        if self.batch_invariant and self.causal:  # each row's kernel family by its role
            prompt_lens = np.fromiter((len(self._seqs[s.seq_id].prompt) for s in plan.seqs),
                                      np.int64, num_seqs)
            split = row_kernels.RowSplit.of(pos >= np.repeat(prompt_lens, np.diff(query_start)))
        with (torch.inference_mode(), lora.active(self._lora_batch(plan, query_start)),
              row_kernels.active(split)):
            # Only with prompt embeddings in the step: the model's other kinds lack the seam.
            embeds = ({"inputs_embeds": self._inputs_embeds(plan, query_start, ids_t)}
                      if self._embeds else {})
            types = pools.token_types(plan, lambda sid: self._seqs[sid].prompt)
            if types is not None:  # a cross-encoder's text pairs (BERT)
                embeds["token_type_ids"] = types
            if not sampling and not prompt_rows and not pool_rows:
                # Only mid-prompt chunks (a prompt longer than the token budget): the KV
                # is the whole result, no row reaches the LM head.
                self.model.hidden_states(ids_t, torch.from_numpy(pos), seam, **embeds)
                return StepResult(step_id=plan.step_id, sampled=())
            if not prompt_rows and not pool_rows:  # the common step: sampling rows only
                logits = self.model.forward(ids_t, torch.from_numpy(pos), seam,
                                            logits_indices=logits_rows, **embeds)
            else:
                hidden = self.model.hidden_states(ids_t, torch.from_numpy(pos), seam,
                                                  **embeds)
                logits = (self.model.compute_logits(hidden.index_select(0, logits_rows))
                          if sampling else None)
                if prompt_rows:
                    prompt_lps = score_prompts(self.model, self.vocab_size, plan, prompt_rows,
                                               query_start, hidden,
                                               lambda sid: self._seqs[sid].prompt)
                pooled = pools.outputs(plan, pool_rows, query_start, hidden, self.model,
                                       lambda sid: len(self._seqs[sid].prompt))
        if not sampling:
            return StepResult(step_id=plan.step_id, sampled=(), prompt_logprobs=prompt_lps,
                              pooled=pooled)
        res = self._sample(plan, sampling, logits)
        if prompt_lps or pooled:
            res = StepResult(step_id=res.step_id, sampled=res.sampled, prompt_logprobs=prompt_lps,
                             pooled=pooled)
        return res

    def _inputs_embeds(self, plan: StepPlan, query_start: np.ndarray,
                       ids: torch.Tensor) -> torch.Tensor | None:
        """The first layer's input rows when some row of the step is a prompt embedding
        (those rows given, the others the tokens' embeddings); None when none is."""
        spans = []  # (first batch row, the embedding rows it starts)
        for i, s in enumerate(plan.seqs):
            rows = self._embeds.get(s.seq_id)
            if rows is not None and s.start_pos < rows.shape[0]:
                count = min(len(s.token_ids), rows.shape[0] - s.start_pos)
                spans.append((int(query_start[i]), rows[s.start_pos: s.start_pos + count]))
        if not spans:
            return None
        x = self.model.embed(ids)
        for at, part in spans:
            x[at: at + part.shape[0]].copy_(part)
        return x

    def _lora_batch(self, plan: StepPlan, query_start: np.ndarray) -> lora.LoraBatch | None:
        """The step's rows grouped by adapter slot; None when every row is the base's."""
        if not self._lora_of or self.lora is None:
            return None
        slots = [self.lora_slots[self._lora_of[s.seq_id]] if s.seq_id in self._lora_of else -1
                 for s in plan.seqs]
        return self.lora.batch(np.repeat(np.asarray(slots, dtype=np.int64),
                                         np.diff(query_start)))

    def _sample(self, plan: StepPlan, sampling: list[int], logits: torch.Tensor) -> StepResult:
        rows = [plan.seqs[i].sample for i in sampling]
        seq_ids = [plan.seqs[i].seq_id for i in sampling]
        states = [self._seqs[sid] for sid in seq_ids]
        sampled = self.sampler.sample(logits, rows, seq_ids, states, self._num_hooked > 0)
        return StepResult(step_id=plan.step_id, sampled=tuple(sampled))

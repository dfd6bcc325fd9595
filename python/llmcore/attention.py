"""attention: the paged KV store and paged attention of the compiled core.

One :class:`AttentionPlan` is built per model step from the step's metadata
(query starts, context lengths, block tables, slot mapping); every layer then
calls :func:`kv_store` and :func:`paged_attention` with that plan and its own
tensors. Tensors are any objects with ``__dlpack__`` (torch tensors, numpy
arrays), borrowed for the call without a copy; the GIL is released while the
kernels run.

KV cache layout (one layer; K and V are separate tensors)::

    cache[num_blocks, num_kv_heads, block_size, head_size]

Token ``t`` of a sequence lives in block ``block_tables[s, t // block_size]``
at offset ``t % block_size``; its slot is ``block_id * block_size + offset``.
The query rows of sequence ``s`` are the last
``query_start[s + 1] - query_start[s]`` of its ``seq_lens[s]`` tokens, so
decode rows (one query) and prefill chunks over a cached prefix mix freely in
one call. Attention is causal.
"""

from __future__ import annotations

# The compiled functions are re-exported as they are (no Python wrapper: a
# model calls them in every layer of every step); their docstrings live in the
# binding (csrc/python/bind_attention.cpp).
from llmcore._C import AttentionPlan, attention_isa, kv_store, paged_attention

__all__ = ["AttentionPlan", "attention_isa", "kv_store", "paged_attention"]

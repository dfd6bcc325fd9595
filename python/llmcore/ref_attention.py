"""ref_attention: a plain torch reference of the KV store and paged attention.

The test oracle for the compiled kernels: it gathers each sequence's K/V from
the paged cache into contiguous tensors and runs
``torch.nn.functional.scaled_dot_product_attention`` with an explicit mask
(the queries are the last ``q_len`` of ``seq_len`` positions; causal; optional
sliding window), repeating KV heads for grouped-query attention. Softcapped
logits are computed by hand, since SDPA has no softcap. Slow and simple on
purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gather_kv", "kv_store_ref", "paged_attention_ref", "visible_mask"]


def _as_tensor(x: object, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(x).to(dtype)


def gather_kv(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` tokens of one sequence: ``[seq_len, num_kv_heads, head_size]``."""
    block_size = cache.shape[2]
    pos = torch.arange(seq_len)
    blocks = block_row.long()[pos // block_size]
    # cache[blocks, :, offset, :] -> [seq_len, num_kv_heads, head_size]
    return cache[blocks, :, pos % block_size, :]


def kv_store_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: object,
) -> None:
    """Write row ``t`` of k/v to slot ``slot_mapping[t]`` (negative slots skipped), in place."""
    slots = _as_tensor(slot_mapping, torch.int64)
    keep = slots >= 0
    block_size = k_cache.shape[2]
    blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
    k_cache[blocks, :, offsets, :] = k[keep].to(k_cache.dtype)
    v_cache[blocks, :, offsets, :] = v[keep].to(v_cache.dtype)


def visible_mask(q_len: int, seq_len: int, sliding_window: int = 0) -> torch.Tensor:
    """Bool ``[q_len, seq_len]``: query ``i`` (position ``seq_len - q_len + i``) sees key ``j``."""
    pos = torch.arange(seq_len - q_len, seq_len).unsqueeze(1)
    key = torch.arange(seq_len).unsqueeze(0)
    mask = key <= pos
    if sliding_window > 0:
        mask &= key > pos - sliding_window
    return mask


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start: object,
    seq_lens: object,
    block_tables: object,
    scale: float,
    sliding_window: int = 0,
    softcap: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Dense attention of ``q`` ``[num_tokens, num_heads, head_size]`` over the paged caches.

    Computes in ``dtype`` (float64 by default, so the reference's own rounding
    does not count against the kernel) and returns ``[num_tokens, num_heads,
    head_size]`` in ``dtype``.
    """
    qs = _as_tensor(query_start, torch.int64).tolist()
    lens = _as_tensor(seq_lens, torch.int64).tolist()
    tables = _as_tensor(block_tables, torch.int64)
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=dtype)
    for s, seq_len in enumerate(lens):
        b, e = qs[s], qs[s + 1]
        if e == b:
            continue
        k = gather_kv(k_cache, tables[s], seq_len).to(dtype).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, tables[s], seq_len).to(dtype).repeat_interleave(group, dim=1)
        qh = q[b:e].to(dtype).transpose(0, 1)  # [heads, q_len, head_size]
        kh, vh = k.transpose(0, 1), v.transpose(0, 1)  # [heads, seq_len, head_size]
        mask = visible_mask(e - b, seq_len, sliding_window)
        if softcap > 0:
            logits = softcap * torch.tanh((qh @ kh.transpose(1, 2)) * scale / softcap)
            probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
            oh = probs @ vh
        else:
            oh = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        out[b:e] = oh.transpose(0, 1)
    return out

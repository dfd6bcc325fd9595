"""The core's CPU paged attention is batch-invariant by itself: a query row's output is the
same bits whatever else its call holds. Alone as a decode row, beside 1 or 31 other
sequences' decode rows, inside a prefill chunk at any offset (its own token block starting
anywhere), in a long prompt chunk, beside other sequences' prefill; contexts from 1 to
2000 positions, so that a small call splits the long ones (split-K) at places that depend
on the call, and a large one does not. Every attention variant the CPU runs, core threads
1 and 2, fp32 and bf16 caches, a sliding window (long enough to be split too), a softcap,
and the head sizes the core has.

What makes this hold (csrc/src/attention/attention_kernel.h, attention_dots.h, attention_cpu.cpp):
the transposed-tile q K^T of a prefill chunk's rows sums over the head dimension in the
row-major order of a decode row's; a tile's positions sit at lanes fixed by the position
(not by where the item's context began); and a row's softmax restarts at every 256
positions and folds those chunks in order, in the kernel and when merging split parts
alike. The serving engine relies on it for its default batch-invariant mode
(test_batch_invariance.py checks that through the server)."""

from __future__ import annotations

import itertools

import llmcore
import numpy as np
import pytest
import torch

HEADS, KV_HEADS, BS = 9, 3, 16
CONTEXT = 2000
# Checked positions: the first, around block, tile (64) and chunk (256) edges, the last.
TARGETS = (0, 1, 15, 16, 63, 64, 200, 255, 256, 300, 511, 512, 777, 1024, 1500, CONTEXT - 1)
SEQS = 32  # the checked sequence (0) and 31 others


class Cache:
    """Random K/V for SEQS sequences of `context` positions in shuffled blocks, a random
    query per (sequence, position), and each other sequence's own context length."""

    def __init__(self, dtype: torch.dtype, head: int, context: int = CONTEXT) -> None:
        gen = torch.Generator().manual_seed(head)
        self.head, self.context = head, context
        per_seq = -(-context // BS)
        shape = (SEQS * per_seq, KV_HEADS, BS, head)
        self.k = torch.randn(shape, generator=gen).to(dtype)
        self.v = torch.randn(shape, generator=gen).to(dtype)
        ids = np.random.default_rng(3).permutation(SEQS * per_seq).astype(np.int32)
        self.tables = ids.reshape(SEQS, per_seq)
        self.q = torch.randn((SEQS, context, HEADS, head), generator=gen)
        self.lens = np.random.default_rng(5).integers(1, context + 1, SEQS)

    def others(self, count: int) -> list[tuple[int, int, int]]:
        """Decode rows of sequences 1 .. count, each at its own context length."""
        return [(s, int(self.lens[s]) - 1, 1) for s in range(1, 1 + count)]

    def call(self, parts: list[tuple[int, int, int]], window: int,
             softcap: float) -> list[torch.Tensor]:
        """One core call over (sequence, first position, rows) parts; each part's rows."""
        lens = [n for _, _, n in parts]
        query_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        seq_lens = np.array([p + n for _, p, n in parts], dtype=np.int32)
        tables = self.tables[[s for s, _, _ in parts]]
        plan = llmcore.AttentionPlan(query_start, seq_lens, tables, None,
                                     num_blocks=self.k.shape[0])
        q = torch.cat([self.q[s, p: p + n] for s, p, n in parts])
        out = torch.empty_like(q)
        llmcore.paged_attention(plan, q, self.k, self.v, out, self.head ** -0.5, window,
                                softcap)
        return [out[a:b] for a, b in itertools.pairwise(query_start)]


def _variants() -> list[str]:
    best = llmcore.isa.FAMILY_ISAS["attention"]
    cpu = llmcore.isa.cpu_isa()
    return [i for i in best if llmcore.isa.ISAS.index(i) <= llmcore.isa.ISAS.index(cpu)]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest):
    before = llmcore.get_num_threads()
    llmcore.set_num_threads(request.param)
    yield request.param
    llmcore.set_num_threads(before)


def _check(cache: Cache, targets: tuple[int, ...], window: int, softcap: float) -> None:
    """Every target row of sequence 0, in each kind of call, equals the row decoded alone."""
    def row(parts: list[tuple[int, int, int]], part: int, index: int) -> torch.Tensor:
        return cache.call(parts, window, softcap)[part][index]

    alone = {p: row([(0, p, 1)], 0, 0) for p in targets}
    long_chunk = min(600, cache.context)
    whole = cache.call([(0, 0, long_chunk)], window, softcap)[0]
    for p in targets:
        back = p % 23  # the row's offset in its chunk: token blocks start anywhere
        n = min(back + 1 + p % 7, cache.context - (p - back))
        calls = {
            "decoded beside 1": row([(0, p, 1), *cache.others(1)], 0, 0),
            "decoded beside 31": row([*cache.others(SEQS - 1), (0, p, 1)], SEQS - 1, 0),
            "in a prefill chunk": row([(0, p - back, n)], 0, back),
            "in a chunk beside a prefill and decodes": row(
                [(3, 0, 45), (0, p - back, n), *cache.others(SEQS - 1)[5:]], 1, back),
        }
        if p < long_chunk:
            calls["in a long prompt chunk"] = whole[p]
        for name, got in calls.items():
            assert torch.equal(got, alone[p]), (p, name, float((got - alone[p]).abs().max()))


@pytest.mark.parametrize("isa", _variants())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (700, 0.0), (0, 30.0)],
                         ids=["causal", "window", "softcap"])
def test_a_row_is_the_same_in_any_call(isa: str, dtype: torch.dtype, window: int,
                                       softcap: float, threads: int, isa_record) -> None:
    cache = Cache(dtype, 64)
    with llmcore.isa.capped(isa, ("attention",)) as ran:
        isa_record.ran("attention-invariance", ran["attention"])
        _check(cache, TARGETS, window, softcap)


@pytest.mark.parametrize("isa", _variants())
@pytest.mark.parametrize("head", [32, 80, 96, 128, 256])
def test_every_head_size(isa: str, head: int, isa_record) -> None:
    """Each head size's kernel (its own lane chains and register blocks), bf16 cache, a
    short window and a softcap, 2 threads."""
    cache = Cache(torch.bfloat16, head, context=1100)
    before = llmcore.get_num_threads()
    llmcore.set_num_threads(2)
    try:
        with llmcore.isa.capped(isa, ("attention",)) as ran:
            isa_record.ran("attention-invariance", ran["attention"])
            _check(cache, (0, 17, 255, 256, 513, 1099), 100, 0.0)
            _check(cache, (0, 300, 1099), 0, 50.0)
    finally:
        llmcore.set_num_threads(before)

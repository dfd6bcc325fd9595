"""Batch-invariant paged attention (attention_seams.row_plans): a query row's output is the
same bits whatever else its call holds: alone as a decode row, among other sequences'
decode rows, inside a prefill chunk of any length beside other sequences, over a context
long enough that the core would split it on a small call. Every attention variant the CPU
runs, core threads 1 and 2, fp32 and bf16 caches, a sliding window and a softcap.

Without the row plans the same calls differ in the last bits (the core forms q K^T on a
transposed tile for a prefill chunk's rows, and splits long contexts of small calls):
what test_batch_invariance.py sees through the server."""

from __future__ import annotations

import itertools

import llmcore
import numpy as np
import pytest
import torch
from actors.core.runner.attention_seams import (
    LayerAttention,
    PagedAttention,
    group_plans,
    row_plans,
)

HEADS, KV_HEADS, HEAD, BS = 9, 3, 64, 16
CONTEXT = 700  # past 2 x 256 positions: a lone decode row on 2 threads is split there
TARGET = range(620, CONTEXT)  # the rows of the checked sequence compared
OTHERS = 20  # other sequences, their own contexts
NUM_BLOCKS = (1 + OTHERS) * (CONTEXT // BS + 1)
PER_SEQ = CONTEXT // BS + 1


class Cache:
    """Random K/V for 1 + OTHERS sequences of CONTEXT positions, each in its own blocks
    (shuffled), and a random query per (sequence, position)."""

    def __init__(self, dtype: torch.dtype) -> None:
        gen = torch.Generator().manual_seed(11)
        shape = (NUM_BLOCKS, KV_HEADS, BS, HEAD)
        self.k = [torch.randn(shape, generator=gen).to(dtype)]
        self.v = [torch.randn(shape, generator=gen).to(dtype)]
        ids = np.random.default_rng(3).permutation(NUM_BLOCKS).astype(np.int32)
        self.tables = ids.reshape(1 + OTHERS, -1)[:, :PER_SEQ]
        self.q = torch.randn((1 + OTHERS, CONTEXT, HEADS, HEAD), generator=gen)

    def kv(self, seq: int, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V rows stored at these positions (a step stores them again, unchanged)."""
        blocks = self.tables[seq, positions // BS]
        off = positions % BS
        return (self.k[0][blocks, :, off].to(torch.float32),
                self.v[0][blocks, :, off].to(torch.float32))

    def step(self, parts: list[tuple[int, int, int]], layers: LayerAttention,
             invariant: bool) -> list[torch.Tensor]:
        """One attention call over (sequence, first position, rows) parts; each part's
        output rows."""
        lens = [n for _, _, n in parts]
        query_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        seq_lens = np.array([p + n for _, p, n in parts], dtype=np.int32)
        owner = np.repeat(np.arange(len(parts)), lens)
        pos = np.concatenate([np.arange(p, p + n) for _, p, n in parts])
        tables = self.tables[[s for s, _, _ in parts]][None].copy()
        plans = group_plans(tables, query_start, seq_lens, owner, pos, BS, NUM_BLOCKS)
        attend = (row_plans(tables, owner, pos, NUM_BLOCKS, llmcore.get_num_threads())
                  if invariant else None)
        seam = PagedAttention(plans, self.k, self.v, layers, attend)
        q = torch.cat([self.q[s, p: p + n] for s, p, n in parts])
        k, v = (torch.cat(x) for x in zip(*(self.kv(s, np.arange(p, p + n))
                                             for s, p, n in parts)))
        out = seam.attn(0, q, k, v)
        return [out[a:b] for a, b in itertools.pairwise(query_start)]


def _layers(window: int, softcap: float) -> LayerAttention:
    return LayerAttention((HEAD ** -0.5,), (window,), (softcap,), (0,), (0,), HEAD ** -0.5)


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


@pytest.mark.parametrize("isa", _variants())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (200, 0.0), (0, 30.0)],
                         ids=["causal", "window", "softcap"])
def test_a_row_is_the_same_in_any_call(isa: str, dtype: torch.dtype, window: int,
                                       softcap: float, threads: int, isa_record) -> None:
    cache = Cache(dtype)
    layers = _layers(window, softcap)
    first, n = TARGET[0], len(TARGET)
    with llmcore.isa.capped(isa, ("attention",)) as ran:
        isa_record.ran("attention-invariance", ran["attention"])
        # the reference: each row decoded alone
        alone = torch.cat([cache.step([(0, p, 1)], layers, True)[0] for p in TARGET])
        others = [(s, CONTEXT - 1, 1) for s in range(1, 1 + OTHERS)]
        calls = {
            "decoded among 20": [cache.step([(0, p, 1), *others], layers, True)[0]
                                 for p in TARGET],
            "one prefill chunk": [cache.step([(0, first, n)], layers, True)[0]],
            "chunks beside decodes and a prefill": [
                cache.step([(3, 0, 45), (0, p, min(37, first + n - p)), *others[5:]], layers,
                           True)[1] for p in range(first, first + n, 37)],
        }
        for name, parts in calls.items():
            got = torch.cat(parts)
            assert torch.equal(got, alone), (name, float((got - alone).abs().max()))

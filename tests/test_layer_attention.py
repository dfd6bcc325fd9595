"""Per-layer attention facts (scale, sliding window, softcap) from a model's attention specs
through the runner's paged seam, against the cache-free DenseCausalAttention, and the dense
backend's softcap against a float64 reference written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actors.core.kv_groups import KVGroups
from actors.core.runner.attention_seams import LayerAttention, PagedAttention, group_plans
from actors.core.runner.model_runner import ModelRunner
from actors.models.attention import DenseCausalAttention, LayerAttentionSpec

HEADS, KV_HEADS, HEAD = 4, 1, 32
BS = 4
# Gemma-like: a scale that is not 1/sqrt(head_size), windows on some layers, a softcap of 50
# (large logits, so that it bends them), and both at once.
SPECS = [
    LayerAttentionSpec(HEADS, KV_HEADS, HEAD, 0.3, None),
    LayerAttentionSpec(HEADS, KV_HEADS, HEAD, 0.05, 5),
    LayerAttentionSpec(HEADS, KV_HEADS, HEAD, 2.0, None, softcap=50.0),
    LayerAttentionSpec(HEADS, KV_HEADS, HEAD, 1.0, 3, softcap=5.0),
]


class SpecsOnly:
    """What the runner reads of a model here: its layers' attention specs."""

    is_causal = True

    def __init__(self, specs: list[LayerAttentionSpec]) -> None:
        self.specs = specs

    def attention_specs(self) -> list[LayerAttentionSpec]:
        return self.specs


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    spec: LayerAttentionSpec) -> torch.Tensor:
    """One sequence from position 0, in float64, written out loop by loop."""
    n = q.shape[0]
    group = spec.num_heads // spec.num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for t in range(n):
        lo = 0 if spec.sliding_window is None else max(0, t - spec.sliding_window + 1)
        for h in range(spec.num_heads):
            logits = (k[lo: t + 1, h // group].double() @ q[t, h].double()) * spec.scale
            if spec.softcap:
                logits = spec.softcap * torch.tanh(logits / spec.softcap)
            out[t, h] = torch.softmax(logits, 0) @ v[lo: t + 1, h // group].double()
    return out


def random_qkv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, HEADS, HEAD, generator=gen)
    return q, torch.randn(n, KV_HEADS, HEAD, generator=gen), torch.randn(n, KV_HEADS, HEAD,
                                                                           generator=gen)


@pytest.mark.parametrize("layer", range(len(SPECS)))
def test_dense_backend_honours_scale_window_and_softcap(layer: int) -> None:
    lens = [9, 6]
    q, k, v = random_qkv(sum(lens), seed=layer)
    got = DenseCausalAttention(SPECS, lens).attn(layer, q, k, v)
    start = 0
    for n in lens:
        want = dense_reference(q[start: start + n], k[start: start + n], v[start: start + n],
                               SPECS[layer])
        assert (got[start: start + n].double() - want).abs().max().item() < 1e-5
        start += n


def test_softcap_matters_in_the_dense_backend() -> None:
    q, k, v = random_qkv(8, seed=3)
    capped = DenseCausalAttention(SPECS, [8]).attn(2, q, k, v)
    plain = DenseCausalAttention([*SPECS[:2], LayerAttentionSpec(HEADS, KV_HEADS, HEAD, 2.0, None)],
                                 [8]).attn(2, q, k, v)
    assert (capped - plain).abs().max().item() > 1e-2


def test_layer_attention_reads_the_specs() -> None:
    la = LayerAttention.of(SpecsOnly(SPECS), len(SPECS), HEAD)
    assert la.scales == (0.3, 0.05, 2.0, 1.0)
    assert la.windows == (0, 5, 0, 3)
    assert la.softcaps == (0.0, 0.0, 50.0, 5.0)
    assert la.default_scale == 1 / math.sqrt(HEAD)


def test_layer_attention_falls_back_without_specs() -> None:
    la = LayerAttention.of(object(), 3, 64, (None, 7, None))
    assert la.scales == (0.125,) * 3 and la.windows == (0, 7, 0) and la.softcaps == (0.0,) * 3
    assert LayerAttention.of(object(), 2, 64).windows == (0, 0)


def test_layer_attention_refuses_groups_that_free_what_a_layer_reads() -> None:
    with pytest.raises(ValueError, match="lists 4 attention specs for 3 layers"):
        LayerAttention.of(SpecsOnly(SPECS), 3, HEAD)
    wrong = KVGroups((None, 4), ((0, 2), (1, 3)), 2)  # layer 1 reads 5 positions back
    with pytest.raises(ValueError, match="layer 1 attends over a window of 5"):
        LayerAttention.of(SpecsOnly(SPECS), len(SPECS), HEAD, groups=wrong)


def test_runner_takes_its_layers_from_the_specs() -> None:
    groups = KVGroups.from_windows([s.sliding_window for s in SPECS])
    runner = ModelRunner(SpecsOnly(SPECS), num_layers=4, num_kv_heads=KV_HEADS, head_size=HEAD,
                         vocab_size=16, num_blocks=8, block_size=BS, dtype=torch.float32,
                         kv_groups=groups)
    assert runner.layers == LayerAttention.of(SpecsOnly(SPECS), 4, HEAD, groups=groups)
    assert len(runner.k_caches) == groups.num_slots


class Step:
    """The paged seam of one step over per-group block tables, as the runner builds it."""

    def __init__(self, runner: ModelRunner, tables: np.ndarray, starts: list[int],
                 lens: list[int]) -> None:
        query_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        seq_lens = np.array([s + n for s, n in zip(starts, lens)], dtype=np.int32)
        owner = np.repeat(np.arange(len(lens)), lens)
        pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])
        plans = group_plans(tables.copy(), query_start, seq_lens, owner, pos, BS,
                            runner.num_blocks)
        self.seam = PagedAttention(plans, runner.k_caches, runner.v_caches, runner.layers)


@pytest.mark.parametrize("hybrid", [False, True])
def test_paged_seam_matches_dense_per_layer(hybrid: bool) -> None:
    """Two sequences: a prompt, then one decode row each, through the paged caches of every
    layer (with KV cache groups or without), against dense attention over the whole."""
    groups = KVGroups.from_windows([s.sliding_window for s in SPECS], hybrid=hybrid)
    runner = ModelRunner(SpecsOnly(SPECS), num_layers=4, num_kv_heads=KV_HEADS, head_size=HEAD,
                         vocab_size=16, num_blocks=32, block_size=BS, dtype=torch.float32,
                         kv_groups=groups)
    lens = [11, 7]
    per_seq = -(-max(lens) // BS)
    ids = iter(np.random.default_rng(0).permutation(32))
    tables = np.array([[[next(ids) for _ in range(per_seq)] for _ in lens]
                       for _ in range(groups.num_groups)], dtype=np.int32)
    qs, ks, vs = zip(*(random_qkv(n, seed=10 + i) for i, n in enumerate(lens)))
    dense = DenseCausalAttention(SPECS, lens)
    prompt = Step(runner, tables, [0, 0], [n - 1 for n in lens])
    decode = Step(runner, tables, [n - 1 for n in lens], [1, 1])
    for layer in range(len(SPECS)):
        cat = [torch.cat(x) for x in (qs, ks, vs)]
        want = dense.attn(layer, *cat)
        first = [torch.cat([x[:-1] for x in xs]) for xs in (qs, ks, vs)]
        last = [torch.stack([x[-1] for x in xs]) for xs in (qs, ks, vs)]
        got_prompt = prompt.seam.attn(layer, *first)
        got_last = decode.seam.attn(layer, *last)
        rows = [0, *np.cumsum(lens)]
        for s, n in enumerate(lens):
            w = want[rows[s]: rows[s + 1]]
            p = got_prompt[rows[s] - s: rows[s] - s + n - 1]
            assert (p - w[:-1]).abs().max().item() < 1e-5, (layer, s)
            assert (got_last[s] - w[-1]).abs().max().item() < 1e-5, (layer, s)

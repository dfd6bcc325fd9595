"""CUDA kernels against the CPU core (the oracle) and an independent torch reference.

KV store must match bit for bit; paged attention within fp32 summation-order tolerance;
sampling must draw the same tokens for the same seeds and report the same ranks and top-N,
with logprobs equal within float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import llmcore  # noqa: E402

if not torch.cuda.is_available() or "cuda" not in llmcore.build_features().split(","):
    pytest.skip("needs a CUDA device and llmcore built with CUDA", allow_module_level=True)

pytestmark = pytest.mark.cuda

BLOCK_SIZE = 16


def _stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


class Batch:
    """A random flattened batch: (seq_len, query_len) per sequence, blocks scattered."""

    def __init__(self, rng: np.random.Generator, specs: list[tuple[int, int]], spare: int = 3):
        self.specs = specs
        blocks_per_seq = [(s + BLOCK_SIZE - 1) // BLOCK_SIZE for s, _ in specs]
        self.max_blocks = max(blocks_per_seq)
        self.num_blocks = sum(blocks_per_seq) + spare
        ids = rng.permutation(self.num_blocks).astype(np.int32)
        self.block_tables = np.full((len(specs), self.max_blocks), -1, np.int32)
        at = 0
        for i, n in enumerate(blocks_per_seq):
            self.block_tables[i, :n] = ids[at : at + n]
            at += n
        self.query_start = np.zeros(len(specs) + 1, np.int32)
        np.cumsum([q for _, q in specs], out=self.query_start[1:])
        self.seq_lens = np.array([s for s, _ in specs], np.int32)
        slots = []
        for i, (s, q) in enumerate(specs):
            for pos in range(s - q, s):
                blk = self.block_tables[i, pos // BLOCK_SIZE]
                slots.append(int(blk) * BLOCK_SIZE + pos % BLOCK_SIZE)
        self.slot_mapping = np.array(slots, np.int64)
        self.num_tokens = int(self.query_start[-1])

    def plan(self, device: str) -> object:
        stream = _stream() if device == "cuda" else 0
        return llmcore.AttentionPlan(
            self.query_start, self.seq_lens, self.block_tables, self.slot_mapping,
            device=device, num_blocks=self.num_blocks, stream=stream,
        )

    def context_slots(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(int(self.seq_lens[i]))
        blocks = torch.from_numpy(self.block_tables[i]).long()[pos // BLOCK_SIZE]
        return blocks, pos % BLOCK_SIZE


def _fill_caches(b: Batch, kv_heads: int, head: int, dtype: torch.dtype, seed: int):
    """Random caches on both devices, with every sequence's context already stored."""
    g = torch.Generator().manual_seed(seed)
    shape = (b.num_blocks, kv_heads, BLOCK_SIZE, head)
    k = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    return k, v, k.cuda(), v.cuda()


def _reference(b: Batch, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               scale: float, window: int, softcap: float) -> torch.Tensor:
    """Causal attention in float64 from the gathered context of each sequence."""
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, (s, ql) in enumerate(b.specs):
        blocks, offs = b.context_slots(i)
        k = k_cache[blocks, :, offs].double().repeat_interleave(heads // kv_heads, 1)  # [s, H, D]
        v = v_cache[blocks, :, offs].double().repeat_interleave(heads // kv_heads, 1)
        for r in range(ql):
            t = int(b.query_start[i]) + r
            pos = s - ql + r
            lo = max(0, pos - window + 1) if window > 0 else 0
            logits = torch.einsum("hd,shd->hs", q[t].double(), k[lo : pos + 1]) * scale
            if softcap > 0:
                logits = softcap * torch.tanh(logits / softcap)
            out[t] = torch.einsum("hs,shd->hd", logits.softmax(-1), v[lo : pos + 1])
    return out


MIXED = [(1, 1), (37, 1), (300, 1), (129, 17), (2500, 1), (64, 64), (700, 3), (16, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "head,heads,kv_heads", [(64, 9, 3), (80, 4, 4), (96, 16, 1), (128, 8, 2)]
)
def test_paged_attention_matches_cpu(dtype: torch.dtype, head: int, heads: int,
                                     kv_heads: int) -> None:
    rng = np.random.default_rng(head + heads)
    b = Batch(rng, MIXED)
    kc, vc, kc_d, vc_d = _fill_caches(b, kv_heads, head, dtype, seed=head)
    q = torch.randn(b.num_tokens, heads, head).to(dtype)
    scale = head**-0.5
    out_cpu = torch.empty_like(q)
    llmcore.paged_attention(b.plan("cpu"), q, kc, vc, out_cpu, scale)
    out_gpu = torch.empty_like(q, device="cuda")
    llmcore.paged_attention(b.plan("cuda"), q.cuda(), kc_d, vc_d, out_gpu, scale,
                            stream=_stream())
    torch.cuda.synchronize()
    got = out_gpu.cpu().float()
    tol = 2e-4 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got, out_cpu.float(), atol=tol, rtol=tol)
    ref = _reference(b, q, kc, vc, scale, 0, 0.0)
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("window,softcap", [(50, 0.0), (0, 5.0), (200, 30.0)])
def test_paged_attention_window_and_softcap(window: int, softcap: float) -> None:
    rng = np.random.default_rng(window)
    b = Batch(rng, MIXED)
    kc, vc, kc_d, vc_d = _fill_caches(b, 2, 64, torch.float32, seed=7)
    q = torch.randn(b.num_tokens, 6, 64) * 3
    out_cpu = torch.empty_like(q)
    llmcore.paged_attention(b.plan("cpu"), q, kc, vc, out_cpu, 0.125, sliding_window=window,
                            softcap=softcap)
    out_gpu = torch.empty_like(q, device="cuda")
    llmcore.paged_attention(b.plan("cuda"), q.cuda(), kc_d, vc_d, out_gpu, 0.125,
                            sliding_window=window, softcap=softcap, stream=_stream())
    got = out_gpu.cpu()
    torch.testing.assert_close(got, out_cpu, atol=2e-4, rtol=2e-4)
    ref = _reference(b, q, kc, vc, 0.125, window, softcap)
    torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=2e-4)


def test_paged_attention_large_decode_batch() -> None:
    # Many rows: one context partition per block (no merge pass).
    rng = np.random.default_rng(3)
    b = Batch(rng, [(int(n), 1) for n in rng.integers(1, 600, size=400)])
    kc, vc, kc_d, vc_d = _fill_caches(b, 3, 64, torch.bfloat16, seed=3)
    q = torch.randn(b.num_tokens, 9, 64).to(torch.bfloat16)
    out_cpu = torch.empty_like(q)
    llmcore.paged_attention(b.plan("cpu"), q, kc, vc, out_cpu, 0.125)
    out_gpu = torch.empty_like(q, device="cuda")
    llmcore.paged_attention(b.plan("cuda"), q.cuda(), kc_d, vc_d, out_gpu, 0.125,
                            stream=_stream())
    torch.testing.assert_close(out_gpu.cpu().float(), out_cpu.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("src_dtype,cache_dtype", [
    (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
])
def test_kv_store_matches_cpu_bitwise(src_dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    rng = np.random.default_rng(11)
    b = Batch(rng, MIXED)
    b.slot_mapping[::5] = -1  # skipped rows
    kc, vc, kc_d, vc_d = _fill_caches(b, 3, 80, cache_dtype, seed=1)
    # k and v as strided views of one fused qkv projection output.
    qkv = torch.randn(b.num_tokens, 9 + 3 + 3, 80).to(src_dtype)
    k, v = qkv[:, 9:12], qkv[:, 12:15]
    qkv_d = qkv.cuda()
    llmcore.kv_store(b.plan("cpu"), k, v, kc, vc)
    llmcore.kv_store(b.plan("cuda"), qkv_d[:, 9:12], qkv_d[:, 12:15], kc_d, vc_d,
                     stream=_stream())
    assert torch.equal(kc_d.cpu(), kc)
    assert torch.equal(vc_d.cpu(), vc)
    assert not torch.equal(kc, _fill_caches(b, 3, 80, cache_dtype, seed=1)[0])  # it stored


def test_store_then_attend_on_cuda() -> None:
    # A prefill chunk written by kv_store is what attention reads back.
    rng = np.random.default_rng(5)
    b = Batch(rng, [(40, 40), (90, 25), (7, 1)])
    kc, vc, kc_d, vc_d = _fill_caches(b, 2, 128, torch.bfloat16, seed=5)
    k = torch.randn(b.num_tokens, 2, 128).to(torch.bfloat16)
    v = torch.randn(b.num_tokens, 2, 128).to(torch.bfloat16)
    q = torch.randn(b.num_tokens, 8, 128).to(torch.bfloat16)
    plan = b.plan("cuda")
    llmcore.kv_store(plan, k.cuda(), v.cuda(), kc_d, vc_d, stream=_stream())
    out = torch.empty_like(q, device="cuda")
    llmcore.paged_attention(plan, q.cuda(), kc_d, vc_d, out, 128**-0.5, stream=_stream())
    llmcore.kv_store(b.plan("cpu"), k, v, kc, vc)
    ref = _reference(b, q, kc, vc, 128**-0.5, 0, 0.0)
    torch.testing.assert_close(out.cpu().double(), ref, atol=1.6e-2, rtol=1.6e-2)


# ---- sampling ---------------------------------------------------------------------------


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = np.array([t for x in lists for t in x], np.int32)
    return offsets, flat


def _sampling_case(rng: np.random.Generator, rows: int, vocab: int) -> dict[str, object]:
    kind = np.arange(rows) % 8
    temperature = np.where(kind == 0, 0.0, rng.uniform(0.3, 1.5, rows)).astype(np.float32)
    top_k = np.where(kind % 3 == 1, rng.integers(1, 60, rows), 0).astype(np.int32)
    top_k[kind == 7] = vocab // 2
    top_p = np.where(kind % 2 == 1, rng.uniform(0.2, 0.95, rows), 1.0).astype(np.float32)
    top_p[kind == 6] = 1e-6  # keeps exactly the best token
    min_p = np.where(kind == 4, 0.05, 0.0).astype(np.float32)
    rep = np.where(kind == 2, 1.3, 1.0).astype(np.float32)
    pres = np.where(kind == 3, 0.5, 0.0).astype(np.float32)
    freq = np.where(kind == 3, 0.25, 0.0).astype(np.float32)
    prompt = [list(rng.integers(0, vocab, rng.integers(0, 50))) for _ in range(rows)]
    output = [list(rng.integers(0, vocab // 10, rng.integers(0, 30))) for _ in range(rows)]
    banned = [list(rng.integers(0, vocab, 3)) if r % 5 == 0 else [] for r in range(rows)]
    bias_tok = [list(rng.integers(0, vocab, 4)) for _ in range(rows)]
    bias_off, bias_ids = _csr(bias_tok)
    words = (vocab + 31) // 32
    bitmask = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    use_bitmask = (np.arange(rows) % 4 == 3).astype(np.int32)
    return dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=rep, presence_penalty=pres, frequency_penalty=freq,
        seed=rng.integers(0, 2**63, rows, dtype=np.uint64),
        position=rng.integers(0, 5000, rows).astype(np.int64),
        prompt_tokens=_csr(prompt), output_tokens=_csr(output), banned_tokens=_csr(banned),
        logit_bias=(bias_off, bias_ids, rng.normal(0, 2, bias_ids.size).astype(np.float32)),
        allowed_bitmask=bitmask, use_bitmask=use_bitmask,
    )


def _sample(logits: torch.Tensor, case: dict[str, object], **kw: object):
    args = [case[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                              "presence_penalty", "frequency_penalty", "seed", "position")]
    opts = {k: case[k] for k in ("prompt_tokens", "output_tokens", "banned_tokens", "logit_bias",
                                 "allowed_bitmask", "use_bitmask")}
    if logits.is_cuda:
        kw = {**kw, "stream": _stream()}
    return llmcore.sample(logits, *args, **opts, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sample_matches_cpu(dtype: torch.dtype, mode: str) -> None:
    rng = np.random.default_rng(21)
    rows, vocab = 96, 32_003
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    logits[5, 100:200] = float("nan")  # sanitized to masked
    logits[9, 7] = float("inf")
    case = _sampling_case(rng, rows, vocab)
    # listed logprobs: 0..5 ids a row (repeats and masked ids included)
    counts = rng.integers(0, 6, rows)
    listed = (np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
              rng.integers(0, vocab, int(counts.sum())).astype(np.int32))
    cpu = _sample(logits, case, num_top_logprobs=20, logprobs_mode=mode,
                  logprob_token_ids=listed)
    gpu = _sample(logits.cuda(), case, num_top_logprobs=20, logprobs_mode=mode,
                  logprob_token_ids=listed)
    tokens_c, lp_c, rank_c, top_c, toplp_c, listed_c = cpu
    tokens_g, lp_g, rank_g, top_g, toplp_g, listed_g = gpu
    np.testing.assert_allclose(listed_g, listed_c, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(tokens_g, tokens_c)
    np.testing.assert_array_equal(rank_g, rank_c)
    np.testing.assert_array_equal(top_g, top_c)
    np.testing.assert_allclose(lp_g, lp_c, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(toplp_g, toplp_c, rtol=1e-5, atol=1e-4)
    assert len(set(tokens_g.tolist())) > rows // 4  # draws are not all the same token


def test_sample_seeded_draws_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(4)
    rows, vocab = 32, 5000
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)).cuda()
    case = _sampling_case(rng, rows, vocab)
    full = _sample(logits, case)[0]
    one = {k: (v[3:4] if isinstance(v, np.ndarray) and v.ndim == 1 and v.size == rows else v)
           for k, v in case.items()}
    one["allowed_bitmask"] = case["allowed_bitmask"][3:4]
    for key in ("prompt_tokens", "output_tokens", "banned_tokens"):
        off, ids = case[key]
        one[key] = (np.array([0, off[4] - off[3]], np.int32), ids[off[3] : off[4]])
    off, ids, vals = case["logit_bias"]
    one["logit_bias"] = (np.array([0, off[4] - off[3]], np.int32), ids[off[3] : off[4]],
                         vals[off[3] : off[4]])
    alone = _sample(logits[3:4].contiguous(), one)[0]
    assert alone[0] == full[3]


def test_sample_fully_masked_row_and_greedy() -> None:
    vocab = 1000
    logits = torch.randn(3, vocab)
    logits[1] = float("-inf")
    logits[2, 123] = 50.0
    case = dict(temperature=np.array([0.7, 0.7, 0.0], np.float32), top_k=0, top_p=1.0, min_p=0.0,
                repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=1,
                position=0, prompt_tokens=None, output_tokens=None, banned_tokens=None,
                logit_bias=None, allowed_bitmask=None, use_bitmask=None)
    cpu = _sample(logits, case, num_top_logprobs=3)
    gpu = _sample(logits.cuda(), case, num_top_logprobs=3)
    assert gpu[0][1] == llmcore.NO_TOKEN == cpu[0][1]
    assert gpu[0][2] == 123 and gpu[2][2] == 1
    assert np.isneginf(gpu[1][1]) and gpu[2][1] == 0
    np.testing.assert_array_equal(gpu[3][1], [llmcore.NO_TOKEN] * 3)
    np.testing.assert_array_equal(gpu[0], cpu[0])

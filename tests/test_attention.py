"""Paged attention and the KV store of the compiled core against the dense torch reference."""

from __future__ import annotations

import ctypes
import json
import math
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import llmcore
import numpy as np
import pytest
import torch
from llmcore.ref_attention import kv_store_ref, paged_attention_ref
from subproc import child_env

FP32_TOL = 1e-5
BF16_TOL = 2e-2


@dataclass
class Batch:
    """A flattened step over a paged cache with shuffled block ids."""

    q_lens: list[int]
    seq_lens: list[int]
    num_kv_heads: int
    group: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    seed: int = 0
    spare_blocks: int = 3
    query_start: np.ndarray = field(init=False)
    block_tables: np.ndarray = field(init=False)
    slots: np.ndarray = field(init=False)
    k_cache: torch.Tensor = field(init=False)
    v_cache: torch.Tensor = field(init=False)
    q: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        rng = random.Random(self.seed)
        bs = self.block_size
        need = [math.ceil(n / bs) for n in self.seq_lens]
        num_blocks = sum(need) + self.spare_blocks
        ids = list(range(num_blocks))
        rng.shuffle(ids)
        width = max([1, *need])
        self.block_tables = np.full((len(need), width), -1, dtype=np.int32)
        slots = []
        for s, n in enumerate(need):
            self.block_tables[s, :n] = [ids.pop() for _ in range(n)]
            for pos in range(self.seq_lens[s] - self.q_lens[s], self.seq_lens[s]):
                slots.append(int(self.block_tables[s, pos // bs]) * bs + pos % bs)
        self.query_start = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        self.slots = np.array(slots, dtype=np.int64)
        shape = (num_blocks, self.num_kv_heads, bs, self.head_size)
        self.k_cache = torch.randn(shape, generator=gen).to(self.dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(self.dtype)
        heads = self.num_kv_heads * self.group
        self.q = torch.randn(self.num_tokens, heads, self.head_size, generator=gen).to(self.dtype)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_size)

    def plan(self) -> llmcore.AttentionPlan:
        return llmcore.AttentionPlan(
            self.query_start,
            np.array(self.seq_lens, dtype=np.int32),
            self.block_tables,
            self.slots,
            num_blocks=self.k_cache.shape[0],
        )

    def reference(self, sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        return paged_attention_ref(
            self.q,
            self.k_cache,
            self.v_cache,
            self.query_start,
            self.seq_lens,
            self.block_tables,
            self.scale,
            sliding_window,
            softcap,
        )

    def run(self, sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        out = torch.full_like(self.q, float("nan"))
        llmcore.paged_attention(
            self.plan(),
            self.q,
            self.k_cache,
            self.v_cache,
            out,
            self.scale,
            sliding_window,
            softcap,
        )
        return out


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                 fp32_tol: float = FP32_TOL) -> None:
    tol = fp32_tol if dtype == torch.float32 else BF16_TOL
    err = (got.double() - want.double()).abs().max().item()
    assert err <= tol, f"max abs error {err:.3g} > {tol}"


# (q_lens, seq_lens): decode rows, prefill with and without a cached prefix,
# chunked prefill, and mixes of them in one call.
SHAPES = [
    ([1], [1]),
    ([1, 1, 1, 1], [7, 16, 33, 130]),
    ([9], [9]),
    ([12, 1, 5, 1], [40, 97, 5, 64]),
    ([3, 20], [200, 20]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("head_size", [32, 64, 80, 96, 128, 256])
def test_matches_reference(dtype: torch.dtype, group: int, head_size: int) -> None:
    seed = group * 1000 + head_size
    q_lens, seq_lens = SHAPES[seed % len(SHAPES)]
    batch = Batch(q_lens, seq_lens, 2, group, head_size, [16, 32][seed % 2], dtype, seed)
    assert_close(batch.run(), batch.reference(), dtype)


@pytest.mark.parametrize("seed", range(12))
def test_randomized_batches(seed: int) -> None:
    rng = random.Random(seed)
    num_seqs = rng.randint(1, 6)
    q_lens, seq_lens = [], []
    for _ in range(num_seqs):
        q_len = rng.choice([1, 1, rng.randint(1, 40)])
        q_lens.append(q_len)
        seq_lens.append(q_len + rng.choice([0, rng.randint(0, 300)]))
    dtype = rng.choice([torch.float32, torch.bfloat16])
    window = rng.choice([0, 0, rng.randint(1, 100)])
    softcap = rng.choice([0.0, 0.0, 3.0])
    batch = Batch(
        q_lens,
        seq_lens,
        rng.choice([1, 2, 3]),
        rng.choice([1, 3, 4, 8]),
        rng.choice([32, 64, 80, 96, 128, 256]),
        rng.choice([16, 32]),
        dtype,
        seed,
    )
    assert_close(batch.run(window, softcap), batch.reference(window, softcap), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_and_softcap(dtype: torch.dtype) -> None:
    batch = Batch([1, 17, 1], [300, 60, 45], 2, 4, 64, 16, dtype, seed=7)
    for window in (1, 10, 64):
        assert_close(
            batch.run(sliding_window=window), batch.reference(sliding_window=window), dtype
        )
    assert_close(batch.run(softcap=2.0), batch.reference(softcap=2.0), dtype)
    # The window must matter, or this test proves nothing.
    assert (batch.reference(sliding_window=10) - batch.reference()).abs().max() > 1e-2


# Gemma 3 270M's attention: 4 query heads over one KV head of 256, window 512 on five of six
# layers (cut to 40 here so these contexts cross it), bf16 cache. Decode at long contexts (split
# across threads), a whole prompt, a prompt chunk after a cached prefix, and both in one call.
GEMMA3_STEPS = {
    "decode": ([1, 1, 1], [700, 41, 3]),
    "prefill": ([90], [90]),
    "chunk_after_prefix": ([37], [301]),
    "mixed": ([50, 1, 1, 9], [50, 1200, 64, 70]),
}


@pytest.mark.parametrize("isa", llmcore.isa.FAMILY_ISAS["attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", sorted(GEMMA3_STEPS))
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (40, 0.0), (0, 50.0), (40, 50.0)])
def test_head_256_one_kv_head_every_variant(
    isa: str, dtype: torch.dtype, step: str, window: int, softcap: float
) -> None:
    if llmcore.isa.ISAS.index(isa) > llmcore.isa.ISAS.index(llmcore.cpu_isa()):
        pytest.skip(f"this CPU runs {llmcore.cpu_isa()} at most")
    q_lens, seq_lens = GEMMA3_STEPS[step]
    batch = Batch(q_lens, seq_lens, 1, 4, 256, 16, dtype, seed=len(step) + window)
    # Logits large enough for a softcap of 50 to bend them (Gemma 2 caps at 50.0). The
    # kernels' tanh(y) = 1 - 2 / (e^2y + 1) is exact to about one float32 ulp of 1, so a
    # capped logit is off by up to ~cap * 2^-23 = 6e-6 at cap 50: fp32 outputs agree to 5e-5.
    batch.q = batch.q * 10.0 if softcap else batch.q
    tol = 5e-5 if softcap else FP32_TOL
    want = batch.reference(window, softcap)
    with llmcore.isa.capped(isa, ("attention",)) as got:
        assert got["attention"] == isa
        for threads in (1, 2):
            out = at_threads(threads, lambda: batch.run(window, softcap))
            assert_close(out, want, dtype, tol)
    if softcap:  # the cap must matter, or this case proves nothing
        assert (batch.reference(window) - want).abs().max() > 1e-2


def test_long_context_split_matches_single_thread() -> None:
    # Batch 1 over a long context is split across threads and merged.
    batch = Batch([1], [3000], 3, 3, 64, 16, torch.float32, seed=3)
    want = batch.reference()
    threads = llmcore.get_num_threads()
    try:
        llmcore.set_num_threads(1)
        single = batch.run()
        llmcore.set_num_threads(2)
        split = batch.run()
    finally:
        llmcore.set_num_threads(threads)
    assert_close(single, want, torch.float32)
    assert_close(split, want, torch.float32)


def at_threads(threads: int, fn):  # noqa: ANN001, ANN201 - a thunk and its result
    saved = llmcore.get_num_threads()
    try:
        llmcore.set_num_threads(threads)
        return fn()
    finally:
        llmcore.set_num_threads(saved)


# The engine's steps on SmolLM2-135M (9 query heads, 3 KV heads, head size 64,
# block size 16), cut down to test size: batched decode (items then read whole
# blocks, every KV head), whole prompts from position 0 (query tiles of many
# rows), and both in one call.
ENGINE_STEPS = {
    "decode": ([1] * 24, [200 + 5 * i for i in range(24)]),
    "prefill": ([70, 45, 64, 3], [70, 45, 64, 3]),
    "mixed": ([70, 1, 1, 33, *[1] * 10], [70, 210, 64, 33, *range(20, 300, 31)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", sorted(ENGINE_STEPS))
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (50, 0.0), (0, 5.0)])
def test_engine_steps(dtype: torch.dtype, step: str, window: int, softcap: float) -> None:
    q_lens, seq_lens = ENGINE_STEPS[step]
    batch = Batch(q_lens, seq_lens, 3, 3, 64, 16, dtype, seed=len(step) + window)
    want = batch.reference(window, softcap)
    for threads in (1, 2):
        assert_close(at_threads(threads, lambda: batch.run(window, softcap)), want, dtype)


def test_mixed_dtypes_and_strided_q() -> None:
    batch = Batch([4, 1], [10, 30], 2, 3, 64, 16, torch.bfloat16, seed=11)
    # q as a view into a fused qkv projection: non-contiguous rows.
    qkv = torch.randn(batch.num_tokens, 6 + 2 + 2, 64).to(torch.bfloat16)
    batch.q = qkv[:, :6]
    out = torch.empty(batch.num_tokens, 6, 64, dtype=torch.float32)
    llmcore.paged_attention(batch.plan(), batch.q, batch.k_cache, batch.v_cache, out, batch.scale)
    assert_close(out, batch.reference(), torch.bfloat16)


def test_numpy_arrays_work() -> None:
    batch = Batch([3, 1], [20, 50], 2, 4, 64, 16, torch.float32, seed=5)
    out = np.full(tuple(batch.q.shape), np.nan, dtype=np.float32)
    llmcore.paged_attention(
        batch.plan(),
        batch.q.numpy(),
        batch.k_cache.numpy(),
        batch.v_cache.numpy(),
        out,
        batch.scale,
    )
    assert_close(torch.from_numpy(out), batch.reference(), torch.float32)


@pytest.mark.parametrize(
    ("src", "cache"),
    [
        (torch.float32, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
def test_kv_store_round_trip(src: torch.dtype, cache: torch.dtype) -> None:
    batch = Batch([5, 1, 2], [5, 40, 18], 3, 1, 64, 16, cache, seed=2)
    slots = batch.slots.copy()
    slots[1] = -1  # not stored
    plan = llmcore.AttentionPlan(
        batch.query_start, np.array(batch.seq_lens, np.int32), batch.block_tables, slots
    )
    # Strided k/v: views into a fused projection.
    kv = torch.randn(batch.num_tokens, 2, 3, 64).to(src)
    k, v = kv[:, 0], kv[:, 1]
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    llmcore.kv_store(plan, k, v, k_cache, v_cache)
    want_k, want_v = batch.k_cache.clone(), batch.v_cache.clone()
    kv_store_ref(k, v, want_k, want_v, slots)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)
    # The skipped row left its slot alone; the others changed theirs.
    b, o = divmod(int(batch.slots[1]), 16)
    assert torch.equal(k_cache[b, :, o], batch.k_cache[b, :, o])
    b, o = divmod(int(batch.slots[0]), 16)
    assert not torch.equal(k_cache[b, :, o], batch.k_cache[b, :, o])


def test_store_then_attend() -> None:
    """The model's order: store the step's K/V, then attend over the cache."""
    batch = Batch([6, 1], [6, 25], 2, 2, 64, 16, torch.float32, seed=9)
    plan = batch.plan()
    k = torch.randn(batch.num_tokens, 2, 64)
    v = torch.randn(batch.num_tokens, 2, 64)
    llmcore.kv_store(plan, k, v, batch.k_cache, batch.v_cache)
    out = torch.empty_like(batch.q)
    llmcore.paged_attention(plan, batch.q, batch.k_cache, batch.v_cache, out, batch.scale)
    assert_close(out, batch.reference(), torch.float32)
    # The first sequence has no cached prefix: its first token sees only itself.
    assert torch.allclose(out[0], v[0].repeat_interleave(2, dim=0), atol=1e-6)


# ---------------------------------------------------------------- errors


@pytest.fixture
def small() -> Batch:
    return Batch([2, 1], [2, 20], 2, 2, 64, 16, torch.float32, seed=1)


def attend(batch: Batch, plan: llmcore.AttentionPlan | None = None, **tensors: object) -> None:
    args = {"q": batch.q, "k_cache": batch.k_cache, "v_cache": batch.v_cache}
    args["out"] = torch.empty_like(batch.q)
    args.update(tensors)
    llmcore.paged_attention(plan or batch.plan(), scale=batch.scale, **args)  # type: ignore[arg-type]


def test_error_wrong_dims(small: Batch) -> None:
    with pytest.raises(ValueError, match="q must have 3 dims"):
        attend(small, q=small.q.reshape(small.num_tokens, -1))
    with pytest.raises(ValueError, match="k_cache must have 4 dims"):
        attend(small, k_cache=small.k_cache[0])


def test_error_mismatched_shapes(small: Batch) -> None:
    with pytest.raises(ValueError, match="must be a positive multiple of num_kv_heads"):
        attend(small, q=torch.randn(3, 5, 64), out=torch.empty(3, 5, 64))
    with pytest.raises(ValueError, match="out has 2 heads but q has 4"):
        attend(small, out=torch.empty(3, 2, 64))
    with pytest.raises(ValueError, match="q has 4 rows but the plan has 3 tokens"):
        attend(small, q=torch.randn(4, 4, 64), out=torch.empty(4, 4, 64))
    with pytest.raises(ValueError, match="same shape"):
        attend(small, v_cache=small.v_cache[:, :1].contiguous())


def test_error_bad_head_size() -> None:
    batch = Batch([1], [3], 1, 1, 64, 16, torch.float32)
    cache = torch.zeros(batch.k_cache.shape[:3] + (72,))
    with pytest.raises(ValueError, match="head_size 72 is not supported"):
        attend(
            batch, q=torch.randn(1, 1, 72), k_cache=cache, v_cache=cache, out=torch.empty(1, 1, 72)
        )


def test_error_wrong_dtype(small: Batch) -> None:
    with pytest.raises(ValueError, match="q must be float32 or bfloat16, got float16"):
        attend(small, q=small.q.half())
    with pytest.raises(ValueError, match="must have the same dtype"):
        attend(small, v_cache=small.v_cache.to(torch.bfloat16))
    with pytest.raises(ValueError):
        attend(small, q=small.q.double())


def test_error_non_contiguous_cache(small: Batch) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        attend(small, k_cache=small.k_cache.transpose(1, 2).contiguous().transpose(1, 2))


def test_error_block_ids(small: Batch) -> None:
    tables = small.block_tables.copy()
    tables[1, 0] = 99
    args = (small.query_start, np.array(small.seq_lens, np.int32), tables, small.slots)
    with pytest.raises(ValueError, match=r"block id 99 in block_tables\[1\]\[0\] is out of range"):
        llmcore.AttentionPlan(*args, num_blocks=small.k_cache.shape[0])
    # Unchecked at plan time (num_blocks=0): caught when the caches are known.
    plan = llmcore.AttentionPlan(*args)
    with pytest.raises(ValueError, match="block id 99 .* out of range for a cache of"):
        attend(small, plan)
    tables[1, 0] = -1  # padding may not be read either
    with pytest.raises(ValueError, match="block id -1"):
        attend(small, llmcore.AttentionPlan(*args[:2], tables, args[3]))


def test_error_slots(small: Batch) -> None:
    slots = small.slots.copy()
    slots[2] = small.k_cache.shape[0] * 16
    plan = llmcore.AttentionPlan(
        small.query_start, np.array(small.seq_lens, np.int32), small.block_tables, slots
    )
    k = torch.zeros(3, 2, 64)
    with pytest.raises(ValueError, match=f"slot {slots[2]} is out of range"):
        llmcore.kv_store(plan, k, k, small.k_cache, small.v_cache)
    with pytest.raises(ValueError, match="k/v have 3/3 heads but the caches have 2"):
        llmcore.kv_store(
            plan, torch.zeros(3, 3, 64), torch.zeros(3, 3, 64), small.k_cache, small.v_cache
        )


def test_error_plan_metadata(small: Batch) -> None:
    lens = np.array(small.seq_lens, np.int32)
    with pytest.raises(ValueError, match="query_start must be non-decreasing"):
        llmcore.AttentionPlan(np.array([0, 2, 1], np.int32), lens, small.block_tables, None)
    with pytest.raises(ValueError, match=r"query_start\[0\] must be 0"):
        llmcore.AttentionPlan(np.array([1, 2, 3], np.int32), lens, small.block_tables, None)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 1 is less than its 2 query tokens"):
        llmcore.AttentionPlan(
            small.query_start, np.array([1, 20], np.int32), small.block_tables, None
        )
    with pytest.raises(ValueError, match="2-D array"):
        llmcore.AttentionPlan(small.query_start, lens, small.block_tables.ravel(), None)
    with pytest.raises(ValueError, match="slot_mapping has 2 entries"):
        llmcore.AttentionPlan(small.query_start, lens, small.block_tables, np.array([0, 1]))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        llmcore.AttentionPlan(small.query_start, lens, small.block_tables, None, device="tpu")
    # A plan without slots still attends, but cannot store.
    plan = llmcore.AttentionPlan(small.query_start, lens, small.block_tables, None)
    with pytest.raises(ValueError, match="without slot_mapping"):
        llmcore.kv_store(
            plan, torch.zeros(3, 2, 64), torch.zeros(3, 2, 64), small.k_cache, small.v_cache
        )
    assert (plan.num_seqs, plan.num_tokens, plan.device) == (2, 3, "cpu")


class _FakeCudaTensor:
    """A DLPack producer that claims to live on CUDA device 0 (never read)."""

    class _DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p),
            ("device_type", ctypes.c_int32),
            ("device_id", ctypes.c_int32),
            ("ndim", ctypes.c_int32),
            ("code", ctypes.c_uint8),
            ("bits", ctypes.c_uint8),
            ("lanes", ctypes.c_uint16),
            ("shape", ctypes.POINTER(ctypes.c_int64)),
            ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
            ("manager_ctx", ctypes.c_void_p),
            ("deleter", ctypes.c_void_p),
        ]

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.tensor = self._DLTensor(
            data=0x1000, device_type=2, device_id=0, ndim=len(shape), code=2, bits=32, lanes=1
        )
        self.tensor.shape = self.shape

    def __dlpack__(self, **kwargs: object) -> object:
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.tensor), b"dltensor", None)


def test_error_mismatched_devices(small: Batch) -> None:
    fake = _FakeCudaTensor(tuple(small.k_cache.shape))
    with pytest.raises(ValueError, match="k_cache is on cuda but the plan is on cpu"):
        attend(small, k_cache=fake)
    fake_q = _FakeCudaTensor(tuple(small.q.shape))
    with pytest.raises(ValueError, match="q is on cuda but the plan is on cpu"):
        attend(small, q=fake_q)


def test_cuda_plan_needs_cuda(small: Batch) -> None:
    if "cuda" in llmcore.build_features():
        pytest.skip("this build has CUDA")
    with pytest.raises(NotImplementedError, match="no CUDA"):
        llmcore.AttentionPlan(
            small.query_start,
            np.array(small.seq_lens, np.int32),
            small.block_tables,
            None,
            device="cuda",
        )


def test_attention_isa_is_reported() -> None:
    assert llmcore.attention_isa() in {"avx512", "avx2", "scalar"}


def test_bench_kernels_quick_prints_one_json_document() -> None:
    root = Path(__file__).resolve().parents[1]
    env = child_env()
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "bench_kernels.py"), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    cases = report["attention"]["decode"]
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    for case in cases:
        assert case["ours_us"] > 0 and case["sdpa_us"] > 0
        tol = FP32_TOL if case["dtype"] == "float32" else BF16_TOL
        assert case["max_abs_diff_vs_sdpa"] <= tol
    assert report["attention"]["memcpy"]["gb_per_s"] > 0

#!/usr/bin/env bash
# GPU check: build llmcore with CUDA for the GPU present, run the CPU-vs-CUDA parity tests
# (tests/test_cuda.py), then benchmark decode paged attention at SmolLM2 geometry
# (9 heads, 3 KV heads, head size 64, bf16, block size 16) against torch SDPA on contiguous
# K/V and against the device's copy bandwidth.
#
#   usage (repo root, machine with an NVIDIA GPU and a CUDA build of torch):
#       scripts/gpu_check.sh
#   writes $OUT/gpu_check.json and $OUT/gpu_check.log when OUT is set (else JSON on stdout,
#   log in build-gpu/gpu_check.log). Needs about 2-4 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
mkdir -p "$BUILD"
DEST=${OUT:-$BUILD}
mkdir -p "$DEST"
LOG="$DEST/gpu_check.log"
: >"$LOG"
PY=${PYTHON:-python3}
step() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }
die() { step "FAILED: $*"; exit 1; }

step "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found (install the CUDA toolkit)"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH

# Python packages the check needs; installed only when missing (the machine may be offline).
for pkg in numpy pytest pybind11 ninja cmake; do
  "$PY" -c "import $pkg" 2>/dev/null || { step "installing $pkg"; "$PY" -m pip install -q "$pkg" >>"$LOG" 2>&1 || step "could not install $pkg"; }
done
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>>"$LOG" \
  || die "this check needs a CUDA build of torch with a visible GPU (torch.cuda.is_available() is False or torch is missing)"
command -v ninja >/dev/null && GEN=(-G Ninja) || GEN=()

step "configure (CMAKE_CUDA_ARCHITECTURES=native)"
cmake -S . -B "$BUILD" "${GEN[@]}" -DLLMCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
  -DPython_EXECUTABLE="$(command -v "$PY")" >>"$LOG" 2>&1 || die "cmake configure (see $LOG)"
step "build"
cmake --build "$BUILD" -j "$(nproc)" >>"$LOG" 2>&1 || die "build (see $LOG)"
step "C/C++ tests"
ctest --test-dir "$BUILD" --output-on-failure >>"$LOG" 2>&1; CTEST_RC=$?
step "ctest rc=$CTEST_RC"

step "pytest tests/test_cuda.py"
PYTHONPATH=python timeout 240 "$PY" -m pytest tests/test_cuda.py -q -p no:cacheprovider \
  --junitxml="$BUILD/test_cuda.xml" >>"$LOG" 2>&1; PYTEST_RC=$?
tail -n 5 "$LOG" >&2
step "pytest rc=$PYTEST_RC"

step "benchmark"
PYTHONPATH=python CTEST_RC=$CTEST_RC PYTEST_RC=$PYTEST_RC JUNIT="$BUILD/test_cuda.xml" \
  timeout 150 "$PY" - >"$BUILD/gpu_check.json" 2>>"$LOG" <<'PYEOF'
from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

import numpy as np
import torch
import torch.nn.functional as F

import llmcore

BS, HEADS, KV, D = 16, 9, 3, 64
dev = torch.device("cuda")
stream = int(torch.cuda.current_stream().cuda_stream)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def timed(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e-3  # seconds


def memcpy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / t  # read + write bytes per second


def bench(batch: int, ctx: int) -> dict[str, object]:
    blocks_per_seq = ctx // BS
    num_blocks = batch * blocks_per_seq
    table = torch.randperm(num_blocks).to(torch.int32).reshape(batch, blocks_per_seq).numpy()
    plan = llmcore.AttentionPlan(
        np.arange(batch + 1, dtype=np.int32), np.full(batch, ctx, np.int32), table,
        (table[:, -1].astype(np.int64) * BS + BS - 1), device="cuda", num_blocks=num_blocks,
        stream=stream)
    kc = torch.randn(num_blocks, KV, BS, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(batch, HEADS, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    scale = D**-0.5
    t_ours = timed(lambda: llmcore.paged_attention(plan, q, kc, vc, out, scale, stream=stream))
    # Correctness at benchmark size against SDPA on the gathered contiguous K/V.
    idx = torch.from_numpy(table).long().to(dev)
    k = kc[idx].permute(0, 2, 1, 3, 4).reshape(batch, KV, ctx, D).contiguous()
    v = vc[idx].permute(0, 2, 1, 3, 4).reshape(batch, KV, ctx, D).contiguous()
    qs = q.unsqueeze(2)  # [batch, heads, 1, D]
    try:
        sdpa = lambda: F.scaled_dot_product_attention(qs, k, v, scale=scale, enable_gqa=True)
        ref = sdpa()
    except TypeError:  # torch without enable_gqa: expand K/V once, outside the timing
        k2, v2 = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
        sdpa = lambda: F.scaled_dot_product_attention(qs, k2, v2, scale=scale)
        ref = sdpa()
    max_err = (out.float() - ref.squeeze(2).float()).abs().max().item()
    t_sdpa = timed(sdpa)
    kv_bytes = 2 * batch * ctx * KV * D * 2
    row = dict(batch=batch, context=ctx, us_paged=t_ours * 1e6, us_sdpa=t_sdpa * 1e6,
               paged_kv_gbps=kv_bytes / t_ours / 1e9, sdpa_kv_gbps=kv_bytes / t_sdpa / 1e9,
               max_abs_err_vs_sdpa=max_err)
    log(json.dumps(row))
    return row


def test_counts() -> dict[str, object]:
    res: dict[str, object] = {"pytest_rc": int(os.environ["PYTEST_RC"]),
                              "ctest_rc": int(os.environ["CTEST_RC"])}
    try:
        root = ET.parse(os.environ["JUNIT"]).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        for key in ("tests", "failures", "errors", "skipped"):
            res[key] = int(suite.get(key, 0))
        res["failed_cases"] = [c.get("classname", "") + "::" + c.get("name", "")
                               for c in suite.iter("testcase")
                               if c.find("failure") is not None or c.find("error") is not None]
    except Exception as exc:  # noqa: BLE001 - report, do not hide the benchmark
        res["junit_error"] = repr(exc)
    return res


result: dict[str, object] = {
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "llmcore_features": llmcore.build_features(),
    "tests": test_counts(),
}
bw = memcpy_bandwidth()
result["memcpy_gbps"] = bw / 1e9
log(f"device copy bandwidth {bw / 1e9:.0f} GB/s")
rows = []
for ctx in (1024, 4096):
    for batch in (1, 8, 32, 64):
        try:
            rows.append(bench(batch, ctx))
        except Exception as exc:  # noqa: BLE001 - one failed size must not hide the others
            rows.append(dict(batch=batch, context=ctx, error=repr(exc)))
            log(f"batch {batch} ctx {ctx}: {exc!r}")
for r in rows:
    if "paged_kv_gbps" in r:
        r["fraction_of_memcpy"] = r["paged_kv_gbps"] * 1e9 / bw
result["paged_attention_decode"] = rows
print(json.dumps(result, indent=2))
PYEOF
BENCH_RC=$?
step "benchmark rc=$BENCH_RC"
if [ -n "${OUT:-}" ]; then cp "$BUILD/gpu_check.json" "$OUT/gpu_check.json"; else cat "$BUILD/gpu_check.json"; fi
[ "$PYTEST_RC" -eq 0 ] && [ "$CTEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]

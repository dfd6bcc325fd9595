"""Every script runs in a smoke form: it starts, measures something tiny and prints
one JSON document, a benchmark's with its baseline, soak's and chaos's with their verdicts.
(bench_kernels is smoked in test_attention.py; gpu_check.sh needs a GPU and is checked for
syntax only.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from subproc import child_env

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_json(*args: str, timeout: float = 600) -> dict:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=child_env(),
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_kv_sliding_bytes_smoke() -> None:
    out = run_json(str(SCRIPTS / "kv_sliding_bytes.py"), "--context", "1024", "--prompt", "1000")
    freed, full = out["freed"], out["full"]
    assert freed["groups"] == 6 and freed["layers_per_block"] == 3 and full["groups"] == 1
    # Gemma 3's shape at 1024 tokens: the sliding groups hold their 512-token windows only.
    assert freed["blocks_held_per_group"] == [64, 32, 32, 32, 32, 32]
    assert freed["bytes_held"] == out["ideal_bytes"] < full["bytes_held"]
    assert freed["blocks_peak"] <= freed["blocks_bound"]


def test_bench_linear_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_linear.py"), "--threads", "1", "--m", "1", "8",
                   "--shapes", "o_proj", "--repeats", "3")
    rows = out["kernels"]
    assert {r["M"] for r in rows} == {1, 8} and {r["shape"] for r in rows} == {"o_proj"}
    for r in rows:
        assert r["packed_bf16_ms"] > 0 and r["torch_fp32_ms"] > 0
        # Both times are rounded to 0.1 us in the record, so the ratio of the rounded times can differ
        # from the recorded ratio (taken before rounding) in its last digit.
        ratio = r["torch_fp32_ms"] / r["packed_bf16_ms"]
        assert r["speedup_packed_vs_torch_fp32"] == pytest.approx(ratio, rel=0.01, abs=0.011)


def test_bench_moe_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_moe.py"), "--threads", "1", "--experts", "4", "--hidden",
                   "64", "--intermediate", "32", "--top-k", "2", "--tokens", "1", "3",
                   "--formats", "bfloat16", "q4_0", "--repeats", "3", "--cache-bytes", "1")
    rows = out["results"]
    assert [(r["format"], r["tokens"]) for r in rows] == [
        ("bfloat16", 1), ("bfloat16", 3), ("q4_0", 1), ("q4_0", 3)]
    for r in rows:
        assert r["grouped_ms"] > 0 and r["loop_ms"] > 0 and r["max_rel_diff"] < 1e-5
        # the ratio is taken before the times are rounded to 0.1 us
        assert r["loop_over_grouped"] == pytest.approx(r["loop_ms"] / r["grouped_ms"], rel=0.02, abs=0.011)


@pytest.mark.slow
def test_bench_attention_rows_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_attention_rows.py"), "--threads", "1", "--repeats", "1")
    us = out["us"]
    for case in ("prefill_8x250", "decode_32x300", "decode_1x2000"):
        for dtype in ("bfloat16", "float32"):
            for mode in ("core", "row_plans"):
                key = f"{case}/{dtype}/{mode}"
                assert us[key] > 0 and us[f"{key}/min"] > 0 and us[f"{key}/cpu"] > 0


def test_bench_batch_invariance_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_batch_invariance.py"), "--threads", "1", "--prompts",
                   "4", "--prompt-tokens", "24", "--new-tokens", "4", "--rounds", "1")
    assert set(out["median"]) == {"invariant", "routed", "core_attention"}
    for mode, m in out["median"].items():
        assert m["prefill_s"] > 0 and m["total_tok_s"] > 0, mode
    assert out["ratio_to_invariant"]["invariant"]["total_tok_s"] == 1.0
    # the batch-invariant mode routes nothing; the routed one has a table
    assert out["linear_routing"]["invariant"] is None
    assert out["linear_routing"]["routed"] is not None
    assert out["outputs_differing_from_invariant"]["invariant"] == 0


@pytest.mark.slow
def test_bench_engine_quick() -> None:
    out = run_json(str(SCRIPTS / "bench_engine.py"), "--quick", "--kv-cache-memory",
                   str(256 << 20))
    assert out["ours"]["decode_tok_s"] > 0 and out["transformers"]["decode_tok_s"] > 0
    assert set(out["ratios"]) == {"decode_tok_s", "prefill_speedup", "batch_tok_s"}


@pytest.mark.slow
def test_bench_beam_quick() -> None:
    out = run_json(str(SCRIPTS / "bench_beam.py"), "--quick", "--threads", "1")
    for mode in ("beam", "sample"):
        assert out[mode]["requests"] == 2 and out[mode]["returned_tokens"] == 2 * 4 * 4
    assert set(out["ratio_beam_over_sample"]) == {"median_latency", "median_step",
                                                  "returned_tokens_per_s"}


@pytest.mark.slow
def test_bench_serve_against_a_real_server(plain_server) -> None:
    out = run_json(str(SCRIPTS / "bench_serve.py"), "--url", plain_server.url, "--concurrency",
                   "1", "4", "--requests", "4", "--max-tokens", "4")
    assert [r["concurrency"] for r in out["served"]] == [1, 4]
    assert all(r["errors"] == 0 and r["output_tokens"] == 16 for r in out["served"])


def test_bench_burst_against_a_real_server(plain_server) -> None:
    out = run_json(str(SCRIPTS / "bench_burst.py"), "--url", plain_server.url, "--bursts", "2",
                   "4", "--repeats", "1", "--max-tokens", "2", "--prompt-tokens", "40")
    assert out["cpu_threads"] >= 1 and out["cpu"]
    for n in ("2", "4"):
        row = out["served"]["url"][n]
        run = row["runs"][0]
        assert len(run["ttft_ms"]) == int(n) and row["ttft_max_ms"] >= row["ttft_median_ms"] > 0
        # Every sequence was admitted once, by one step or more (grouping is timing here).
        assert run["admitted_sequences"] == int(n) and 1 <= run["admitting_steps"] <= int(n)
        assert out["offline"][n]["offline_prefill_steps"] == 1
        assert row["median_ttft_over_offline_prefill"] > 0


def test_profile_step_smoke() -> None:
    out = run_json(str(SCRIPTS / "profile_step.py"), "--batch", "2", "--context", "20",
                   "--steps", "2")
    parts = out["ms_per_step"]
    assert out["batch"] == 2 and out["step_ms_median"] > 0
    for name in ("attention.paged", "lm_head", "linear.qkv_proj", "linear.down_proj", "sampling"):
        assert parts[name] > 0, name
    assert out["calls_per_step"] >= 10 * 30  # ten native calls per layer of the default model


def test_bench_decode_bw_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_decode_bw.py"), "--tokens", "4", "--repeats", "1",
                   "--bw-mib", "16", "--passes", "1", "--linear-routing", "off", "--breakdown")
    b, d = out["bytes_per_step"], out["decode"]
    # The default model: 30 layers of Q4_1 matrices (20 bytes per 32 weights), the tied
    # 49152 x 576 embedding as the LM head in Q8_0 (34 bytes per 32), a bf16 KV cache of
    # 3 KV heads x 64 at the median context, one Q8_0 row looked up.
    per_layer = (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536) // 32 * 20
    assert b["matrices"] == 30 * per_layer
    assert b["lm_head"] == 49152 * 576 // 32 * 34 and b["embedding_row"] == 576 // 32 * 34
    assert b["kv_cache"] == 30 * 2 * d["context_tokens_median"] * 3 * 64 * 2
    assert b["total"] == sum(b[k] for k in ("matrices", "lm_head", "norms", "embedding_row",
                                            "kv_cache"))
    assert out["routes_m1"] == {}  # routing off: every product on the core's own kernel
    achieved = b["total"] / d["inter_token_ms_median"] / 1e6
    assert out["achieved_gb_s"] == pytest.approx(achieved, rel=0.01)
    assert out["ratio_to_copy"] == pytest.approx(
        out["achieved_gb_s"] / out["bandwidth"]["copy_gb_s"], rel=0.02)
    assert out["cpu"]["threads"] == out["bandwidth"]["threads"] >= 1
    ops = out["breakdown"]["ops"]
    for name in ("lm_head", "linear.gate_up_proj", "attention.paged"):
        assert ops[name]["bytes"] == b["by_op"][name] and ops[name]["gb_s"] > 0, name


def test_gpu_check_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPTS / "gpu_check.sh")], check=True)


def run_verdict(*args: str, timeout: float = 300) -> tuple[int, dict]:
    """(exit status, JSON document) of a script that prints its verdict even when it fails."""
    done = subprocess.run([sys.executable, *args], check=False, capture_output=True,
                          text=True, env=child_env(), timeout=timeout)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


SMOKE_SERVER_ARGS = "--max-model-len 1024 --kv-cache-memory 256m --max-num-seqs 8"


@pytest.mark.slow
def test_soak_smoke_no_errors_flat_rss() -> None:
    rc, out = run_verdict(str(SCRIPTS / "soak.py"), "--start-server", "--server-args",
                          SMOKE_SERVER_ARGS, "--concurrency", "6", "--minutes", "0.4",
                          "--max-tokens", "16", "--sample-interval", "1",
                          "--progress-interval", "10")
    summary = {k: v for k, v in out.items() if k != "rss"}
    assert out["errors"] == 0, summary
    assert out["requests_served"] >= 12, summary
    assert out["ttft_p50_s"] > 0 and out["total_p99_s"] >= out["total_p50_s"] > 0, summary
    rss = out["rss"]
    assert rss["pid"] and len(rss["samples"]) >= 15, rss
    assert rss["flat"] is True, rss
    assert out["after_load"]["idle_after_s"] is not None, out["after_load"]
    assert out["server_exit_code"] == 0, out.get("server_log_tail")
    assert out["ok"] and rc == 0


@pytest.mark.slow
def test_chaos_smoke_settles_and_canary_unchanged() -> None:
    rc, out = run_verdict(str(SCRIPTS / "chaos.py"), "--start-server", "--kills", "80",
                          "--abandon", "30")
    checks = out["checks"]
    failed = {k for k, v in checks.items() if not v}
    assert not failed, (failed, {k: out[k] for k in out if k != "canary"})
    assert set(checks) >= {"no_5xx", "settled_after_kills", "settled_after_abandon",
                           "canary_unchanged", "sigterm_all_told_and_exit_0"}
    kinds = out["kills"]["by_kind"]
    assert sum(v for k, v in kinds.items() if k.endswith("_rst")) > 0
    assert sum(v for k, v in kinds.items() if k.endswith("_fin")) > 0
    assert kinds.get("mid_stream_rst", 0) + kinds.get("mid_stream_fin", 0) > 0
    abandon = out["abandon"]
    assert abandon["abandoned_while_queued"] >= 30 and abandon["max_waiting_seen"] > 0, abandon
    assert out["sigterm"]["exit_code"] == 0 and not out["sigterm"]["untold"], out["sigterm"]
    assert out["server_log_errors"] == [], out["server_log_errors"]
    assert out["ok"] and rc == 0


@pytest.mark.slow
def test_bench_fast_forward_smoke() -> None:
    out = run_json(str(SCRIPTS / "bench_fast_forward.py"), "--batch", "1", "--rounds", "1",
                   "--max-tokens", "24", "--dtype", "float32")
    b1 = out["results"]["batch_1"]
    assert b1["outputs_equal"] is True
    assert b1["on"]["output_tokens"] == b1["off"]["output_tokens"] == 24
    assert b1["on"]["model_steps"] < b1["off"]["model_steps"] == 24
    assert b1["tokens_per_s_ratio_on_off"] > 0


def test_arch_metrics_holds_the_tree_to_its_rules() -> None:
    """The house rules arch_metrics counts: no code file over 400 lines, and no API dialect
    imported by a sibling (only the app that mounts the routes and the auth guard that picks
    an envelope by path import dialect packages)."""
    out = run_json(str(SCRIPTS / "arch_metrics.py"))
    assert out["code_files_over_400"] == {}
    importers = {key.split(" -> ")[0] for key in out["dialect_imports"]}
    assert importers <= {"server.app", "server.auth"}, out["dialect_imports"]
    assert out["csrc_src_top_level_files"] == 0  # the core's sources live in family folders


def test_wire_record_normalizes_what_differs_between_runs_only() -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import wire_record
    finally:
        sys.path.remove(str(SCRIPTS))
    body = ('{"id":"chatcmpl-3f9a1c","created":1765000000,"x":0.0386211462,'
            '"url":"http://127.0.0.1:38621/v1","msg":"msg_01AbC","n":38621}')
    got = wire_record.normalize(body, 38621)
    assert got == ('{"id":"<id>","created": <t>,"x":0.0386211462,'
                   '"url":"http://127.0.0.1:<port>/v1","msg":"<id>","n":38621}')
    same = {"a": {"status": 200, "body": "x"}}
    assert wire_record.compare(same, dict(same)) == 0
    assert wire_record.compare(same, {"a": {"status": 200, "body": "y"}}) == 1
    assert wire_record.compare(same, {}) == 1

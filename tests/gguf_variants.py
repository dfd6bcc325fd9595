"""GGUF files that carry a real model's tokenizer under another family's settings, so that
the families without a GGUF at hand (Qwen 2/3, Llama 3, Llama 2/Mistral, Phi-3) are checked
against llama.cpp too: the vocabulary and merges are SmolLM2's (BPE) or Gemma 3's
(SentencePiece), the pre-tokenizer name, space prefix, model name or architecture are the
family's, and those are what decide how llama.cpp splits text.

    write_variant(name, out, tensors=False)

With tensors=True the file also holds a tiny random Llama (one layer, width 64) so that
llama-server can load it (scripts/llama_reference.py --variant records its /tokenize);
without, it is tokenizer metadata only, which is all write_tokenizer reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# name -> (source model, architecture written, metadata set over the source's)
VARIANTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("default", "qwen2", {"tokenizer.ggml.pre": "qwen2"}),
    "llama-bpe": ("default", "llama", {"tokenizer.ggml.pre": "llama-bpe"}),
    "gpt2": ("default", "llama", {"tokenizer.ggml.pre": "gpt-2"}),
    "spm-space-prefix": ("gemma-3-270m", "llama",
                         {"tokenizer.ggml.add_space_prefix": True, "general.name": "Llama"}),
    # transformers builds a "phi3" SentencePiece tokenizer its own way (the prefix space from
    # a normalizer). llama.cpp's rule for models named Phi-3 (whitespace after a special
    # token dropped) needs Phi-3's own vocabulary (<s>, </s>, <|endoftext|>): not covered.
    "phi3": ("gemma-3-270m", "phi3",
             {"tokenizer.ggml.add_space_prefix": True, "general.name": "Llama"}),
}

_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
           "tokenizer.ggml.merges")
_WIDTH = 64


def source_path(model: str) -> Path:
    from actors.loader.default_model import default_model_path, named_gguf_path

    return default_model_path() if model == "default" else named_gguf_path(model)


def write_variant(name: str, out: Path, tensors: bool = False) -> Path:
    import gguf
    from actors.loader.gguf_file import GGUFFile
    from actors.loader.gguf_tokenizer import read_metadata

    model, arch, overrides = VARIANTS[name]
    src = source_path(model)
    reader = GGUFFile(src)
    meta = {k: v for k, v in read_metadata(src).items()
            if k.startswith("tokenizer.") or k == "general.name"}
    meta.update(overrides)
    # llama-server loads the tensors as a Llama whatever the name says; our reader takes
    # the architecture from the file.
    w = gguf.GGUFWriter(str(out), "llama" if tensors else arch)
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            raise TypeError(f"{key}: {type(value).__name__}")
    for key in _ARRAYS:
        if key in reader:
            w.add_array(key, reader.get(key))
    vocab = reader.array_len("tokenizer.ggml.tokens")
    if tensors:
        _tiny_llama(w, vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _tiny_llama(w: Any, vocab: int) -> None:
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(_WIDTH)
    w.add_feed_forward_length(_WIDTH)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(_WIDTH // 2)
    w.add_vocab_size(vocab)
    rng = np.random.default_rng(0)

    def mat(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(vocab, _WIDTH))
    w.add_tensor("output_norm.weight", np.ones(_WIDTH, np.float32))
    for part in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{part}.weight", np.ones(_WIDTH, np.float32))
    for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                 "ffn_down"):
        w.add_tensor(f"blk.0.{part}.weight", mat(_WIDTH, _WIDTH))

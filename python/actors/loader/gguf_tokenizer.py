"""A GGUF's tokenizer as Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json)
that tokenize as llama.cpp does.

    write_tokenizer(gguf_path, out_dir) -> True when written (False: the GGUF has none)

The vocabulary, merges and added tokens come from transformers' GGUF support
(AutoTokenizer.from_pretrained(gguf_file=...)); what it leaves to chance is set here from
the file's own metadata, following llama.cpp (src/llama-vocab.cpp), the reference the tests
check against token for token (tests/data/llama_cpp_tokens_*.json, recorded from
llama-server's /tokenize by scripts/llama_reference.py):

- BPE vocabularies (tokenizer.ggml.model "gpt2": SmolLM, Llama 3, Qwen 2/3): text is split
  by the regular expressions llama.cpp picks for tokenizer.ggml.pre, applied in turn (each
  splits the pieces the one before made), then bytes map to GPT-2's alphabet. SmolLM's
  "smollm" splits every digit off first; "llama-bpe" and the like take a whole word that
  is one token before trying merges (ignore_merges). An unknown pre-tokenizer name keeps
  transformers' split and is logged.
- SentencePiece vocabularies (tokenizer.ggml.model "llama": Gemma, Llama 2, Mistral,
  Phi-3): byte fallback; spaces become "▁" in a normalizer, and when
  tokenizer.ggml.add_space_prefix says so (llama.cpp's default; Gemma: no) a "▁" goes
  before the text and before every piece after a special or user-defined token, as
  llama.cpp puts one there (a Metaspace pre-tokenizer would put it only at the start);
  decoding then drops the first token's leading space, as llama.cpp's does.
- BOS/EOS: added by the post-processor exactly when tokenizer.ggml.add_bos_token /
  add_eos_token say so (llama.cpp's defaults when absent: BOS for SentencePiece and for
  the pre-tokenizers that ask for it, EOS never).
- tokenizer.chat_template is carried (saved beside the tokenizer) when the file has one; a
  base model without one gets none (the server then refuses chat requests as vLLM does).

The metadata is read with gguf_file.GGUFFile, which steps over the large arrays (gguf-py's
reader builds an object per array element: seconds for a 262k vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from actors.loader.gguf_file import GGUFFile
from actors.loader.progress import log, stage

__all__ = ["read_metadata", "write_tokenizer"]

# llama.cpp's split expressions by tokenizer.ggml.pre (llm_tokenizer_bpe), in the form it
# runs them (its case-insensitive contractions spelled out).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_SPLITS: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), (_LLAMA3,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), (_QWEN2,)),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "mpt", "olmo"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "exaone"),
                    (r"\p{N}", _GPT2)),
}
# Pre-tokenizers for which llama.cpp takes a word that is one token whole, and adds BOS.
_IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})

# GGUF architectures whose name is also transformers' tokenizer type for the class its
# config would pick. Llama's config picks the plain backend (transformers has no "llama"
# tokenizer type).
_TYPED_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "qwen2", "qwen3", "phi3"})


def _typed(meta: dict[str, Any]) -> bool:
    return meta.get("general.architecture") in _TYPED_ARCHS


def _tokenizer_class(meta: dict[str, Any]) -> Any:
    """The class AutoTokenizer would pick, named up front where it is known: otherwise
    AutoTokenizer reads the whole file (every tensor's header, with gguf-py's slow reader)
    only to learn the model's type. Same files written; Gemma 3's 262k-token file takes
    ~2 s instead of ~13, SmolLM2's 0.2 s instead of 3."""
    from transformers import AutoTokenizer

    if meta.get("general.architecture") == "llama":
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend
    return AutoTokenizer


def read_metadata(gguf_path: Path) -> dict[str, Any]:
    """The scalar and string metadata of a GGUF file (little-endian, version 2 or 3);
    arrays are skipped, their keys absent."""
    f = GGUFFile(gguf_path, max_array=0)
    return {k: f.get(k) for k in f.keys() if f.types(k)[0] != GGUFValueType.ARRAY}


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLITS[pre]]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _post_processor(tok: Any, add_bos: bool, add_eos: bool) -> Any:
    from tokenizers import processors

    specials = []
    if add_bos:
        specials.append((tok.bos_token, tok.bos_token_id))
    if add_eos:
        specials.append((tok.eos_token, tok.eos_token_id))
    bos = [f"{tok.bos_token}:0"] if add_bos else []
    eos = [f"{tok.eos_token}:0"] if add_eos else []
    return processors.TemplateProcessing(
        single=[*bos, "$A:0", *eos], pair=[*bos, "$A:0", *eos, *bos, "$B:1", *eos],
        special_tokens=specials)


def _sentencepiece(backend: Any, space_prefix: bool) -> None:
    from tokenizers import decoders, normalizers

    steps = [normalizers.Replace(" ", "\u2581")]
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), *steps] if space_prefix else steps)
    backend.pre_tokenizer = None
    strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])


def write_tokenizer(gguf_path: Path, out_dir: Path) -> bool:
    """Writes tokenizer.json and tokenizer_config.json for ``gguf_path`` into ``out_dir``
    (which exists). False, writing nothing, when the file carries no tokenizer."""
    meta = read_metadata(gguf_path)
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return False
    with stage(f"building the tokenizer of {gguf_path.name} ({kind}) from GGUF metadata"):
        tok = _tokenizer_class(meta).from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True,
            **({"tokenizer_type": meta["general.architecture"]} if _typed(meta) else {}))
        backend = tok.backend_tokenizer
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        add_bos = kind == "llama"  # llama.cpp's default: SentencePiece adds BOS, BPE not
        if kind == "llama":
            _sentencepiece(backend, bool(meta.get("tokenizer.ggml.add_space_prefix", True)))
        if kind == "gpt2":
            if pre in _SPLITS:
                backend.pre_tokenizer = _pre_tokenizer(pre)
            else:
                log.warning("%s: pre-tokenizer %r is unknown here; its split is transformers'",
                            gguf_path.name, pre)
            if pre in _IGNORE_MERGES:
                backend.model.ignore_merges = True
                add_bos = True
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        backend.post_processor = _post_processor(tok, add_bos, add_eos)
        template = meta.get("tokenizer.chat_template")
        tok.chat_template = template
        tok.save_pretrained(str(out_dir))
        # the flags a loader reads agree with the post-processor
        path = out_dir / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config.update(add_bos_token=add_bos, add_eos_token=add_eos)
        if template is None:
            config.pop("chat_template", None)
            (out_dir / "chat_template.jinja").unlink(missing_ok=True)
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return True

"""The tokenizer write_tokenizer builds from a GGUF tokenizes as llama.cpp does, token for
token, on multilingual text (German umlauts, Chinese, Japanese, Arabic, Greek, Cyrillic,
Hebrew, Hindi, Korean, Thai, emoji with modifiers and ZWJ sequences, code with tabs and
runs of spaces, leading spaces, digits, special-token text), with and without the BOS/EOS
the file asks for.

The references were recorded from llama.cpp's llama-server /tokenize on these very files
(tests/data/llama_cpp_tokens_*.json, written by scripts/llama_reference.py; each records its
file's sha256 and the llama.cpp commit), so no llama.cpp is needed here. The families with
no GGUF at hand are checked on variants (tests/gguf_variants.py): SmolLM2's vocabulary under
Qwen 2's, Llama 3's and GPT-2's split, Gemma 3's under Llama 2's space prefix and as a
"phi3" file. The tokenizer is
loaded as the server loads it (server.supervisor.load_tokenizer) and encodes as the server
does (the Rust tokenizer, added tokens matched in the text)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from actors.loader.gguf_tokenizer import read_metadata, write_tokenizer
from gguf_variants import VARIANTS, write_variant

DATA = Path(__file__).parent / "data"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_of(name: str) -> Path:
    from actors.loader.default_model import DefaultModelMissing, default_model_path, named_gguf_path

    try:
        return default_model_path() if name == "default" else named_gguf_path(name)
    except DefaultModelMissing as exc:
        pytest.skip(f"{name}: its package is not installed ({exc})")


# reference file -> the model it was recorded on, or the variant (gguf_variants.VARIANTS)
REFERENCES = {"smollm2": "default", "gemma-3-270m": "gemma-3-270m",
              **{f"variant-{v}": v for v in VARIANTS}}


@pytest.fixture(scope="module", params=sorted(REFERENCES))
def case(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict, Path]:
    from server.supervisor import load_tokenizer

    reference = json.loads((DATA / f"llama_cpp_tokens_{request.param}.json").read_text())
    name = REFERENCES[request.param]
    tmp = tmp_path_factory.mktemp("tokenizer")
    source = gguf_of(VARIANTS[name][0] if name in VARIANTS else name)
    assert sha256(source) == reference["source"]["gguf_sha256"], "recorded on another file"
    gguf = write_variant(name, tmp / f"{name}.gguf") if name in VARIANTS else source
    out = tmp / "out"
    out.mkdir()
    assert write_tokenizer(gguf, out)
    return load_tokenizer(str(out)), reference, gguf


def test_tokens_equal_llama_cpp(case) -> None:
    tok, reference, _ = case
    for row in reference["texts"]:
        assert tok(row["text"], add_special_tokens=False)["input_ids"] == row["ids"], row["text"]
        assert tok(row["text"])["input_ids"] == row["ids_add_special"], row["text"]


def test_decoding_gives_the_text_back(case) -> None:
    tok, reference, gguf = case
    if read_metadata(gguf).get("tokenizer.ggml.add_space_prefix", True) and \
            read_metadata(gguf)["tokenizer.ggml.model"] == "llama":
        # the space put after each special or user-defined token stays (in llama.cpp too)
        pytest.skip("a SentencePiece space prefix is no round trip")
    for row in reference["texts"]:
        assert tok.decode(row["ids"]) == row["text"]


def test_the_chat_template_is_the_files_own(case) -> None:
    tok, _, gguf = case
    template = read_metadata(gguf).get("tokenizer.chat_template")
    assert tok.chat_template == template  # Gemma 3 270M base has none: None here too


def test_a_gguf_without_a_tokenizer_writes_nothing(tmp_path: Path) -> None:
    from test_server_refusals import tiny_gguf

    gguf = tiny_gguf(tmp_path / "weights-only.gguf", "llama")
    out = tmp_path / "out"
    out.mkdir()
    assert write_tokenizer(gguf, out) is False and not list(out.iterdir())


def test_read_metadata_agrees_with_gguf_py(default_model_path: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(default_model_path)
    ours = read_metadata(default_model_path)
    theirs = {k: f.contents() for k, f in reader.fields.items()
              if not k.startswith("GGUF.") and f.types[0] != gguf.GGUFValueType.ARRAY}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value) if isinstance(value, float) else ours[key] == value

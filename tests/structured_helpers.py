"""Shared pieces of the structured-outputs tests: the default model's tokenizer and a
guidance backend over it (built once per process: the tokenizer takes seconds to load), and
walkers that drive a matcher to termination through its bitmask."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import numpy as np
import pytest
from actors.core.structured import bitmask_words, make_backend


@functools.cache
def _tokenizer() -> Any:
    from actors.loader import prepare_model_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(prepare_model_dir(None)[1]))


@functools.cache
def _backend(name: str) -> Any:
    return make_backend(name, _tokenizer())


@pytest.fixture
def tok() -> Any:
    from actors.loader import DefaultModelMissing

    try:
        return _tokenizer()
    except DefaultModelMissing as e:
        pytest.skip(str(e))


@pytest.fixture
def backend(tok: Any) -> Any:
    return _backend("guidance")


@pytest.fixture
def xgr_backend(tok: Any) -> Any:
    pytest.importorskip("xgrammar", reason="xgrammar is optional and not installed")
    return _backend("xgrammar")


def allowed(m: Any, vocab: int) -> np.ndarray:
    row = np.zeros(bitmask_words(vocab), np.int32)
    m.fill_bitmask(row)
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])


def walk(backend: Any, m: Any, seed: int | None = None, cap: int = 300) -> list[int]:
    """Tokens from the start to termination: the lowest allowed id, or a seeded draw."""
    rng = None if seed is None else np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(cap):
        ids = allowed(m, backend.vocab_size)
        assert len(ids), "the mask allowed nothing"
        t = int(ids[0] if rng is None else rng.choice(ids))
        assert m.accept(t), f"accept refused token {t} that the mask allowed"
        out.append(t)
        if m.is_terminated():
            return out
    raise AssertionError(f"not terminated after {cap} tokens: {out[:40]}")


def conforms(instance: Any, schema: dict[str, Any]) -> None:
    """jsonschema's verdict on the instance (without re-checking the schema itself, which
    jsonschema.validate does first and which takes seconds for the large schemas here)."""
    jsonschema.Draft202012Validator(schema).validate(instance)


def text(tok: Any, backend: Any, ids: list[int]) -> str:
    return tok.decode([t for t in ids if t not in backend.eos_token_ids])


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                           "ok": {"type": "boolean"}},
            "required": ["zip", "ok"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}


ARITH_LARK = r"""
start: expr
expr: term (OP term)*
term: NUMBER | "(" inner ")"
inner: NUMBER (OP NUMBER)*
OP: "+" | "-" | "*"
NUMBER: /[1-9][0-9]{0,2}/
"""
ARITH_GBNF = r"""
root ::= num (op num)*
op ::= "+" | "-"
num ::= [1-9] [0-9]?
"""

"""The optional xgrammar implementation of ``backend.GrammarBackend`` (``--structured-outputs
backend xgrammar`` once wired); importing this module needs the xgrammar package.

xgrammar precompiles a grammar's token masks (an adaptive per-state cache), so compiles cost
more than llguidance's and masks less. Its JSON schema converter runs in strict mode as vLLM
runs it: objects without ``additionalProperties`` take no extra keys. It has no free-form
whitespace pattern, so a spec with ``whitespace_pattern`` is refused rather than silently
loosened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xgrammar as xgr

from actors.core.structured.backend import (
    CompiledGrammar,
    GrammarBackend,
    Matcher,
    bitmask_words,
    check_row,
)
from actors.core.structured.guidance import _check_rows, _close_objects, _tokenizer_key
from actors.core.structured.spec import StructuredSpec

__all__ = ["XGrammarBackend"]


def _message(err: Exception) -> str:
    # xgrammar prefixes C++ errors with "[time] file.cc:line: "; the client needs the rest
    text = str(err).strip()
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
        if ".cc:" in text.split(": ", 1)[0]:
            text = text.split(": ", 1)[1]
    return text.split("\n", 1)[0]


class XGrammarBackend(GrammarBackend):
    """xgrammar over a Hugging Face tokenizer; keep one per tokenizer."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int | None = None,
                 eos_token_ids: Sequence[int] | None = None, *, threads: int = 2) -> None:
        n_vocab = max(int(vocab_size or 0), len(tokenizer))
        eos = list(eos_token_ids) if eos_token_ids else [int(tokenizer.eos_token_id)]
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=n_vocab,
                                                  stop_token_ids=eos)
        # xgrammar's own cache is off: GrammarCache bounds what is kept
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._tokenizer = tokenizer
        self.vocab_size = n_vocab
        self.eos_token_ids = tuple(eos)
        self._key = _tokenizer_key(tokenizer, n_vocab, self.eos_token_ids)

    @property
    def tokenizer_key(self) -> str:
        return self._key

    def compile_grammar(self, spec: StructuredSpec) -> XGrammarGrammar:
        spec.validate(grammar_check=False, metaschema=False)
        if spec.whitespace_pattern is not None:
            raise spec.refuse("whitespace_pattern is not supported by the xgrammar backend",
                              "whitespace_pattern")
        if spec.kind in ("json", "json_object"):
            spec.check_metaschema()
        try:
            compiled = self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            raise spec.refuse(f"invalid {spec.kind.replace('_', ' ')}: {_message(e)}") from None
        return XGrammarGrammar(self, compiled)

    def _compile(self, spec: StructuredSpec) -> Any:
        c = self._compiler
        compact = spec.disable_any_whitespace
        json_kw: dict[str, Any] = {"any_whitespace": not compact,
                                   "separators": (",", ":") if compact else None}
        if spec.kind in ("json", "json_object"):
            schema = spec.schema()
            if isinstance(schema, dict) and spec.disable_additional_properties:
                schema = _close_objects(schema)
            return c.compile_json_schema(json.dumps(schema), **json_kw)
        if spec.kind == "regex":
            return c.compile_regex(spec.value)
        if spec.kind == "choice":
            members = " | ".join(json.dumps(m, ensure_ascii=False) for m in spec.value)
            return c.compile_grammar(f"root ::= {members}")
        if spec.kind == "grammar":
            text = spec.value
            return c.compile_grammar(text) if "::=" in text else c.compile_lark(text)
        tag = spec.structural_tag()
        if "structures" in tag:
            items = []
            for s in tag["structures"]:
                schema = s.get("schema", {})
                if isinstance(schema, dict):
                    _check_rows(spec, schema)
                items.append(xgr.StructuralTagItem(begin=s["begin"], end=s["end"],
                                                   schema=json.dumps(schema)))
            return c.compile_structural_tag(items, tag.get("triggers", []))
        return c.compile_structural_tag(json.dumps(tag))


class XGrammarGrammar(CompiledGrammar):
    __slots__ = ("_backend", "_compiled")

    def __init__(self, backend: XGrammarBackend, compiled: Any) -> None:
        self._backend = backend
        self._compiled = compiled

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(self._compiled), self._backend)


class XGrammarMatcher(Matcher):
    """A sequence's xgrammar matcher. xgrammar leaves its state unchanged on a rejected
    token and counts every accepted one (EOS included), so rollback maps one to one."""

    __slots__ = ("_accepted", "_m", "_tokenizer", "_words")

    def __init__(self, m: Any, backend: XGrammarBackend) -> None:
        self._m = m
        self._words = bitmask_words(backend.vocab_size)
        self._tokenizer = backend._tokenizer
        self._accepted = 0

    def fill_bitmask(self, out_row: npt.NDArray[np.int32]) -> None:
        check_row(out_row, self._words)
        self._m.fill_next_token_bitmask(out_row.reshape(1, -1), 0)

    def accept(self, token_id: int) -> bool:
        if self._m.is_terminated() or not self._m.accept_token(int(token_id)):
            return False
        self._accepted += 1
        return True

    def rollback(self, k: int) -> None:
        if k <= 0:
            return
        if k > self._accepted:
            raise ValueError(f"cannot roll back {k} tokens: only {self._accepted} were "
                             "accepted")
        self._m.rollback(k)
        self._accepted -= k

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def is_accepting(self) -> bool:
        return bool(self._m.is_terminated() or self._m.is_completed())

    def forced_tokens(self) -> list[int]:
        # the forced text tokenised the tokenizer's way, less its last token (which could
        # merge with whatever the model writes after it)
        if self._m.is_terminated():
            return []
        forced = self._m.find_jump_forward_string()
        if not forced:
            return []
        return list(self._tokenizer.encode(forced, add_special_tokens=False)[:-1])

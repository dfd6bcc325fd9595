"""The llguidance implementation of ``backend.GrammarBackend``.

llguidance compiles every kind to its own grammar format (Lark plus embedded JSON schemas and
regexes), builds the lexer lazily and walks a token trie per mask, so compiling is cheap and
the first masks of a grammar pay for the lexer states they visit; ``LLParserLimits`` bounds
each mask's work. Its matchers never raise on user errors: they enter an error state whose
mask allows only end-of-sequence, so compile-time problems are surfaced here as refusals.

Two of its limits would only show up mid-generation (an Earley row with more than
``max_items_in_row`` items: an object with hundreds of optional properties, an anyOf with
thousands of object branches); ``_check_rows`` refuses such schemas up front instead, and a
choice list compiles to one lexeme (a regex union) rather than a rule per member, so long
lists work.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import numpy.typing as npt
from llguidance import LLMatcher, LLParserLimits

from actors.core.structured.backend import (
    CompiledGrammar,
    GrammarBackend,
    Matcher,
    bitmask_words,
    check_row,
)
from actors.core.structured.spec import StructuredSpec
from actors.core.structured.structural_tag import read_tags, to_lark

__all__ = ["GuidanceBackend", "check_spec", "serialize"]

_ROW_ITEMS = LLParserLimits().max_items_in_row
# llguidance expands an object's optional properties into ~4 items each in one row (plus a
# few for the braces), so this many keep the row within its limit.
MAX_OPTIONAL_PROPERTIES = (_ROW_ITEMS - 8) // 4
MAX_BRANCHES = _ROW_ITEMS
# keywords whose values are data, not subschemas: a "properties" key inside them is not one
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "x-guidance"})
# "   1 | start: /(ab/" and the caret line under it: llguidance quoting the Lark we generated
_ECHO = re.compile(r"^\s+\d+ \| ")


def _limits() -> LLParserLimits:
    # no parser state or grammar text in error messages: they reach clients
    return LLParserLimits(verbose_errors=False)


def _first_line(err: str) -> str:
    """An llguidance error without its parser-state dump and its echo of our own Lark."""
    lines = err.split("\n<state>", 1)[0].strip().split("\n")
    keep = [ln for i, ln in enumerate(lines)
            if not _ECHO.match(ln) and not (i and _ECHO.match(lines[i - 1]))]
    return "\n".join(keep).strip()


def serialize(spec: StructuredSpec, special_tokens: frozenset[str] = frozenset()) -> str:
    """The llguidance grammar for ``spec`` (refused when the spec is malformed);
    ``special_tokens``: the tokenizer's, which a structural tag's triggers may be."""
    kind = spec.kind
    if kind in ("json", "json_object"):
        return _json_grammar(spec, spec.schema())
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec.value)  # type: ignore[arg-type]
    if kind == "choice":
        # one terminal: members become a single lexeme, not an Earley alternative each
        members = " | ".join(json.dumps(c) for c in spec.value)  # type: ignore[union-attr]
        return LLMatcher.grammar_from_lark(f"start: CHOICE\nCHOICE: {members}\n")
    if kind == "grammar":
        try:
            return llguidance.grammar_from("grammar", spec.value)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - the GBNF converter raises plain Exception
            raise spec.refuse(f"the grammar is neither Lark nor GBNF: {e}") from None
    if kind == "structural_tag":
        return _structural_tag_grammar(spec, special_tokens)
    raise spec.refuse(f"unknown structured output kind {kind!r}")


def check_spec(spec: StructuredSpec) -> None:
    """Refuses ``spec`` when llguidance's compiler rejects it (no tokenizer needed)."""
    err = LLMatcher.validate_grammar(serialize(spec), None, limits=_limits())
    if err:
        raise spec.refuse(_refusal_text(spec, err))


def _refusal_text(spec: StructuredSpec, err: str) -> str:
    what = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex",
            "choice": "choice", "grammar": "grammar",
            "structural_tag": "structural tag"}[spec.kind]
    return f"invalid {what}: {_first_line(err)}"


def _json_grammar(spec: StructuredSpec, schema: dict[str, Any] | bool) -> str:
    if isinstance(schema, dict):
        if spec.disable_additional_properties:
            schema = _close_objects(copy.deepcopy(schema))
        _check_rows(spec, schema)
    options: dict[str, Any] = {"whitespace_flexible": not spec.disable_any_whitespace}
    if spec.whitespace_pattern is not None:
        err = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(spec.whitespace_pattern),
                                         None, limits=_limits())
        if err:
            raise spec.refuse(f"invalid whitespace_pattern: {_first_line(err)}",
                              "whitespace_pattern")
        options["whitespace_pattern"] = spec.whitespace_pattern
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)  # type: ignore[arg-type]
    except ValueError as e:
        raise spec.refuse(f"invalid JSON schema: {e}") from None


def _subschemas(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every dict node of a schema with its JSON path, skipping data-valued keywords."""
    out: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[str, Any]] = [("$", schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            out.append((path, node))
            stack.extend((f"{path}.{k}", v) for k, v in node.items()
                         if k not in _DATA_KEYWORDS and isinstance(v, (dict, list)))
        else:
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node)
                         if isinstance(v, (dict, list)))
    return out


def _check_rows(spec: StructuredSpec, schema: dict[str, Any]) -> None:
    for path, node in _subschemas(schema):
        props = node.get("properties")
        if isinstance(props, dict) and len(props) > MAX_OPTIONAL_PROPERTIES:
            required = node.get("required")
            req = set(required) if isinstance(required, list) else set()
            optional = sum(1 for k in props if k not in req)
            if optional > MAX_OPTIONAL_PROPERTIES:
                raise spec.refuse(
                    f"the JSON schema's object at {path} has {optional} optional properties; "
                    f"at most {MAX_OPTIONAL_PROPERTIES} are supported (list more of them in "
                    "'required')")
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and len(branches) > MAX_BRANCHES:
                raise spec.refuse(f"the JSON schema's {key} at {path} has {len(branches)} "
                                  f"branches; at most {MAX_BRANCHES} are supported")


def _close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """Adds ``additionalProperties: false`` to every object schema that leaves it unset."""
    for _, node in _subschemas(schema):
        if "additionalProperties" not in node and (
                isinstance(node.get("properties"), dict)
                or isinstance(node.get("patternProperties"), dict)):
            node["additionalProperties"] = False
    return schema


def _structural_tag_grammar(spec: StructuredSpec, special: frozenset[str]) -> str:
    items, stop_after_first = read_tags(spec)
    prepared = []
    for item in items:
        schema = item.schema
        if isinstance(schema, dict):
            if spec.disable_additional_properties:
                schema = _close_objects(copy.deepcopy(schema))
            _check_rows(spec, schema)
        prepared.append(dataclasses.replace(item, schema=schema))
    return to_lark(prepared, stop_after_first, special)


def _tokenizer_key(tokenizer: Any, n_vocab: int, eos: Sequence[int]) -> str:
    h = hashlib.sha256()
    h.update(repr((type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""),
                   n_vocab, tuple(eos))).encode())
    h.update(json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]),
                        ensure_ascii=False).encode())
    return h.hexdigest()[:24]


class GuidanceBackend(GrammarBackend):
    """llguidance over a Hugging Face fast tokenizer. Building it costs ~0.5 s (the token
    trie); keep one per tokenizer."""

    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int | None = None,
                 eos_token_ids: Sequence[int] | None = None) -> None:
        n_vocab = max(int(vocab_size or 0), len(tokenizer))
        eos = list(eos_token_ids) if eos_token_ids else None
        self._llt = llguidance.hf.from_tokenizer(tokenizer, n_vocab, eos)
        self.vocab_size = n_vocab
        self.eos_token_ids = tuple(self._llt.eos_tokens)
        self._key = _tokenizer_key(tokenizer, n_vocab, self.eos_token_ids)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._special = frozenset(
            [t.content for t in added.values() if getattr(t, "special", False)]
            + list(getattr(tokenizer, "all_special_tokens", ()) or ()))

    @property
    def tokenizer_key(self) -> str:
        return self._key

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        return self._llt

    def compile_grammar(self, spec: StructuredSpec) -> GuidanceGrammar:
        spec.validate(grammar_check=False, metaschema=False)
        grammar = serialize(spec, self._special)  # refuses what would trip llguidance's limits mid-way
        spec.check_metaschema()
        template = LLMatcher(self._llt, grammar, log_level=0, limits=_limits())
        if not template.is_error():
            # the first mask builds the start state's lexer, shared by every copy; some
            # limits only trip here, and better now than on the request's first step
            scratch = np.zeros(bitmask_words(self.vocab_size), np.int32)
            template.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
        if template.is_error():
            raise spec.refuse(_refusal_text(spec, template.get_error()))
        return GuidanceGrammar(self, template)


class GuidanceGrammar(CompiledGrammar):
    """A compiled llguidance grammar: a matcher at the start, copied for each sequence."""

    __slots__ = ("_backend", "_template")

    def __init__(self, backend: GuidanceBackend, template: LLMatcher) -> None:
        self._backend = backend
        self._template = template

    def matcher(self) -> GuidanceMatcher:
        return GuidanceMatcher(self._template.deep_copy(), self._backend)


class GuidanceMatcher(Matcher):
    """A sequence's llguidance matcher.

    llguidance does not record an end-of-sequence token given once the grammar has stopped
    (nothing else could follow), so ``_history`` keeps, per accepted token, whether
    llguidance counted it: rollback must undo exactly what it recorded.
    """

    __slots__ = ("_canonical", "_eos", "_history", "_m", "_terminated_at", "_words")

    def __init__(self, m: LLMatcher, backend: GuidanceBackend) -> None:
        self._m = m
        self._words = bitmask_words(backend.vocab_size)
        self._eos = frozenset(backend.eos_token_ids)
        self._canonical = backend.ll_tokenizer.is_canonical
        self._history: list[bool] = []
        self._terminated_at: int | None = None

    def fill_bitmask(self, out_row: npt.NDArray[np.int32]) -> None:
        check_row(out_row, self._words)
        self._m.unsafe_compute_mask_ptr(out_row.ctypes.data, out_row.nbytes)

    def accept(self, token_id: int) -> bool:
        if self._terminated_at is not None:
            return False
        token_id = int(token_id)
        if token_id in self._eos and self._m.is_stopped():
            # the grammar is complete (or in error, where the mask allowed only EOS)
            recorded = False
        elif self._m.try_consume_tokens([token_id]) == 1:
            recorded = True
        else:
            return False
        if token_id in self._eos:
            self._terminated_at = len(self._history)
        self._history.append(recorded)
        return True

    def rollback(self, k: int) -> None:
        if k <= 0:
            return
        if k > len(self._history):
            raise ValueError(f"cannot roll back {k} tokens: only {len(self._history)} "
                             "were accepted")
        undone = sum(self._history[-k:])
        del self._history[-k:]
        if undone and not self._m.rollback(undone):
            raise RuntimeError(f"grammar rollback failed: {_first_line(self._m.get_error())}")
        if self._terminated_at is not None and self._terminated_at >= len(self._history):
            self._terminated_at = None

    def is_terminated(self) -> bool:
        return self._terminated_at is not None

    def is_accepting(self) -> bool:
        return self._terminated_at is not None or self._m.is_accepting()

    def forced_tokens(self) -> list[int]:
        # llguidance's fast-forward tokens are the tokenizer's own tokenization of the
        # forced bytes only when the tokenizer is canonical; otherwise report none
        if not self._canonical or self._terminated_at is not None or self._m.is_stopped():
            return []
        return list(self._m.compute_ff_tokens())

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        if self._terminated_at is not None:
            return 0
        return int(self._m.validate_tokens([int(t) for t in tokens]))

    def error(self) -> str | None:
        err = self._m.get_error()
        return _first_line(err) if err else None

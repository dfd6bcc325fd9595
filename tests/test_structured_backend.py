"""The structured-outputs backend (actors.core.structured) over the default model's real
tokenizer: walks matchers to termination by picking allowed tokens from the bitmask and
checks the decoded text against an independent validator (jsonschema, re, membership, the
grammar's own language), plus rollback, fast-forward tokens and refusals. The compile
cache, pathological specs and the xgrammar backend are in test_structured_cache.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")

from actors.core.structured import StructuredSpec, bitmask_words
from actors.errors import RequestRefused
from structured_helpers import (
    ARITH_GBNF,
    ARITH_LARK,
    SCHEMA,
    allowed,
    backend,
    conforms,
    text,
    tok,
    walk,
)

__all__ = ["backend", "tok"]  # fixtures


# -- walks validated independently ----------------------------------------------------------

@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_json_schema_walk_validates(tok: Any, backend: Any, seed: int | None) -> None:
    # one optional space between tokens keeps a random walk from rambling in whitespace
    spec = StructuredSpec.from_params(json=SCHEMA, whitespace_pattern=r"[ ]?")
    out = text(tok, backend, walk(backend, backend.compile(spec), seed))
    conforms(json.loads(out), SCHEMA)


def test_json_compact_whitespace_and_closed_objects(tok: Any, backend: Any) -> None:
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}},
                   "required": ["a"]}
    spec = StructuredSpec.from_params(json=open_schema, disable_any_whitespace=True,
                                      disable_additional_properties=True)
    for seed in (None, 5, 6):
        out = text(tok, backend, walk(backend, backend.compile(spec), seed))
        assert " " not in out and "\n" not in out, out
        assert list(json.loads(out)) == ["a"], out


def test_json_object(tok: Any, backend: Any) -> None:
    # any object: free keys make random walks endless, so feed texts instead
    spec = StructuredSpec.from_params(json_object=True)
    m = backend.compile(spec)
    for t in tok.encode('{"k": [1, {"n": null}], "s": "x"}', add_special_tokens=False):
        assert m.accept(t)
    assert backend.eos_token_ids[0] in allowed(m, backend.vocab_size)
    assert m.accept(backend.eos_token_ids[0]) and m.is_terminated()
    for not_object in ("[1]", "12", '"s"'):
        m = backend.compile(spec)
        assert not all(m.accept(t) for t in tok.encode(not_object, add_special_tokens=False))


@pytest.mark.parametrize("seed", [None, 7, 8, 9])
def test_regex_walk_fullmatches(tok: Any, backend: Any, seed: int | None) -> None:
    pattern = r"[a-z]{2,6}@[a-z]{2,6}\.(com|org|net)"
    out = text(tok, backend, walk(backend, backend.compile(
        StructuredSpec.from_params(regex=pattern)), seed))
    assert re.fullmatch(pattern, out), out


@pytest.mark.parametrize("seed", [None, 10, 11, 12, 13])
def test_choice_walk_is_a_member(tok: Any, backend: Any, seed: int | None) -> None:
    # prefixes of one another, quotes, backslashes and non-ASCII must all stay literal
    choices = ["a", "ab", "abc", 'say "hi"', "back\\slash", "café ☕"]
    out = text(tok, backend, walk(backend, backend.compile(
        StructuredSpec.from_params(choice=choices)), seed))
    assert out in choices, out


@pytest.mark.parametrize("seed", [None, 14, 15, 16])
def test_lark_grammar_walk_parses(tok: Any, backend: Any, seed: int | None) -> None:
    spec = StructuredSpec.from_params(grammar=ARITH_LARK)
    out = text(tok, backend, walk(backend, backend.compile(spec), seed))
    # flatten parentheses, then the language is a regular one Python can check
    flat = out
    while "(" in flat:
        inner = re.sub(r"\(([^()]*)\)", r"\1", flat)
        assert inner != flat, out
        flat = inner
    assert re.fullmatch(r"[1-9][0-9]{0,2}([-+*][1-9][0-9]{0,2})*", flat), out
    # and llguidance's own parser accepts the text re-tokenised the tokenizer's way
    m = backend.compile(spec)
    for t in tok.encode(out, add_special_tokens=False):
        assert m.accept(t), out
    assert m.is_accepting(), out


def test_gbnf_grammar_walk(tok: Any, backend: Any) -> None:
    spec = StructuredSpec.from_params(grammar=ARITH_GBNF)
    for seed in (None, 18, 19):
        out = text(tok, backend, walk(backend, backend.compile(spec), seed))
        assert re.fullmatch(r"[1-9][0-9]?([-+][1-9][0-9]?)*", out), out


def test_bitmask_drives_the_compiled_sampler(tok: Any, backend: Any) -> None:
    sampling = pytest.importorskip("llmcore.sampling")
    m = backend.compile(StructuredSpec.from_params(choice=["yes", "no"]))
    row = np.zeros(bitmask_words(backend.vocab_size), np.int32)
    rng = np.random.default_rng(0)
    out = []
    while not m.is_terminated():
        m.fill_bitmask(row)
        batch = sampling.SamplingBatch()
        batch.add(temperature=1.0, seed=3, position=len(out), allowed_bitmask=row)
        logits = rng.standard_normal((1, backend.vocab_size)).astype(np.float32)
        t = int(batch.sample(logits).tokens[0])
        assert m.accept(t)
        out.append(t)
    assert text(tok, backend, out) in ("yes", "no")


# -- matcher state ---------------------------------------------------------------------------

def test_rollback_restores_state(tok: Any, backend: Any) -> None:
    spec = StructuredSpec.from_params(json=SCHEMA, disable_any_whitespace=True)
    ids = walk(backend, backend.compile(spec), seed=21)
    m = backend.compile(spec)
    masks = []
    for t in ids:
        masks.append(allowed(m, backend.vocab_size))
        assert m.accept(t)
    assert m.is_terminated()
    for k in (1, 3, 7):  # back to the state before token len - k (through the EOS too)
        m2 = backend.compile(spec)
        for t in ids:
            assert m2.accept(t)
        m2.rollback(k)
        assert not m2.is_terminated()
        np.testing.assert_array_equal(allowed(m2, backend.vocab_size), masks[len(ids) - k])
        for t in ids[len(ids) - k:]:  # and the same tokens are accepted again
            assert m2.accept(t)
        assert m2.is_terminated()
    with pytest.raises(ValueError):
        m.rollback(len(ids) + 1)
    m.rollback(len(ids))
    np.testing.assert_array_equal(allowed(m, backend.vocab_size), masks[0])


def test_rejected_token_leaves_state(tok: Any, backend: Any) -> None:
    m = backend.compile(StructuredSpec.from_params(regex=r"[0-9]+"))
    before = allowed(m, backend.vocab_size)
    bad = tok.encode("x", add_special_tokens=False)[0]
    assert bad not in before
    assert not m.accept(bad)
    assert not m.accept(backend.eos_token_ids[0])  # nothing yet: EOS is not allowed
    np.testing.assert_array_equal(allowed(m, backend.vocab_size), before)
    assert m.error() is None
    assert m.accept(tok.encode("7", add_special_tokens=False)[0])
    assert m.is_accepting() and not m.is_terminated()
    assert backend.eos_token_ids[0] in allowed(m, backend.vocab_size)
    assert m.validate_tokens([bad]) == 0


def test_fresh_matchers_are_independent(backend: Any) -> None:
    grammar = backend.compile_grammar(StructuredSpec.from_params(choice=["left", "right"]))
    a, b = grammar.matcher(), grammar.matcher()
    first = allowed(a, backend.vocab_size)
    assert a.accept(int(first[0]))
    np.testing.assert_array_equal(allowed(b, backend.vocab_size), first)


def test_forced_tokens_are_exact(tok: Any, backend: Any) -> None:
    keys = ["an_extremely_long_property_name_that_is_fixed",
            "another_quite_verbose_required_field"]
    schema = {"type": "object", "properties": {k: {"type": "boolean"} for k in keys},
              "required": keys, "additionalProperties": False}
    m = backend.compile(StructuredSpec.from_params(json=schema, disable_any_whitespace=True))
    forced = m.forced_tokens()
    assert len(forced) >= 5, forced
    forced_text = tok.decode(forced)
    assert f'{{"{keys[0]}":'.startswith(forced_text) and len(forced_text) > len(keys[0]) // 2
    # exact: the tokenizer's own tokenization of that text, and each accepted in turn
    assert tok.encode(forced_text, add_special_tokens=False) == forced
    for t in forced:
        assert t in allowed(m, backend.vocab_size)
        assert m.accept(t)
    assert m.forced_tokens() == [] or tok.decode(forced + m.forced_tokens()).startswith(
        f'{{"{keys[0]}')
    # a free choice forces nothing
    assert backend.compile(StructuredSpec.from_params(regex=r"[a-z]+")).forced_tokens() == []


def test_bitmask_row_shape_is_checked(backend: Any) -> None:
    m = backend.compile(StructuredSpec.from_params(regex="a"))
    with pytest.raises(ValueError):
        m.fill_bitmask(np.zeros(bitmask_words(backend.vocab_size) - 1, np.int32))
    with pytest.raises(ValueError):
        m.fill_bitmask(np.zeros(bitmask_words(backend.vocab_size), np.int64))


# -- refusals ---------------------------------------------------------------------------------

BAD = [
    ({"json": {"type": "objectx"}}, "structured_outputs.json", "type"),
    ({"json": {"$ref": "#/$defs/missing"}}, "structured_outputs.json", "missing"),
    ({"json": {"type": "string", "pattern": "(ab"}}, "structured_outputs.json", "regex"),
    ({"json": {"type": "string", "pattern": "a(?=b)"}}, "structured_outputs.json", "look"),
    ({"json": {"type": "object", "required": "a"}}, "structured_outputs.json", "required"),
    # llguidance ignores these keywords; only the metaschema check refuses them
    ({"json": {"type": "string", "title": 5}}, "structured_outputs.json", "$.title"),
    ({"json": {"$defs": {"unused": {"type": "wat"}}, "type": "integer"}},
     "structured_outputs.json", "$.$defs.unused.type"),
    ({"json": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "string", "examples": 5}}, "structured_outputs.json", "$.examples"),
    ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
    ({"json": "  "}, "structured_outputs.json", "non-empty"),
    ({"json": "[1, 2]"}, "structured_outputs.json", "object"),
    ({"regex": "(ab"}, "structured_outputs.regex", "unclosed"),
    ({"regex": "a\x00b"}, "structured_outputs.regex", "NUL"),
    ({"grammar": ""}, "structured_outputs.grammar", "non-empty"),
    ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar", "undefined_rule"),
    ({"grammar": "this is ::: not ( a grammar"}, "structured_outputs.grammar", "Lark"),
    ({"choice": []}, "structured_outputs.choice", "non-empty"),
    ({"choice": ["a", 3]}, "structured_outputs.choice", "strings"),
    ({"json_object": False}, "structured_outputs.json_object", "true"),
    ({"json": {"type": "string"}, "whitespace_pattern": "(("},
     "structured_outputs.whitespace_pattern", "whitespace_pattern"),
    ({"structural_tag": {"triggers": ["<f"], "structures": [
        {"begin": "<g>", "schema": {}, "end": "</g>"}]}}, "structured_outputs.structural_tag",
     "trigger"),
    ({"structural_tag": "{}"}, "structured_outputs.structural_tag", "triggers"),
]


@pytest.mark.parametrize(("kwargs", "param", "words"), BAD)
def test_bad_specs_are_refused(backend: Any, kwargs: dict[str, Any], param: str,
                               words: str) -> None:
    with pytest.raises(RequestRefused) as e:
        StructuredSpec.from_params(**kwargs).validate()
    assert e.value.param == param and words.lower() in e.value.message.lower(), e.value.message
    with pytest.raises(RequestRefused) as e2:  # the backend refuses alike on its own
        backend.compile(StructuredSpec.from_params(**kwargs))
    assert e2.value.param == param


def test_one_kind_exactly() -> None:
    with pytest.raises(RequestRefused) as e:
        StructuredSpec.from_params(regex="a", choice=["a"])
    assert e.value.param == "structured_outputs"
    with pytest.raises(RequestRefused):
        StructuredSpec.from_params()


def test_response_format() -> None:
    assert StructuredSpec.from_response_format({"type": "text"}) is None
    assert StructuredSpec.from_response_format({"type": "json_object"}).kind == "json_object"
    spec = StructuredSpec.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}})
    assert spec.kind == "json" and json.loads(spec.value) == {"type": "integer"}
    spec.validate()
    bad = StructuredSpec.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}})
    with pytest.raises(RequestRefused) as e:
        bad.validate()
    assert e.value.param == "response_format"
    with pytest.raises(RequestRefused):
        StructuredSpec.from_response_format({"type": "json_schema", "json_schema": {}})


def test_structural_tag(tok: Any, backend: Any) -> None:
    spec = StructuredSpec.from_params(structural_tag={
        "triggers": ["<fn="],
        "structures": [{"begin": "<fn=add>", "end": "</fn>", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
            "additionalProperties": False}}]})
    m = backend.compile(spec)
    free = "Let me add. "
    call = '<fn=add>{"a": 12}</fn>'
    for t in tok.encode(free + call, add_special_tokens=False):
        assert m.accept(t), t
    bad = backend.compile(spec)
    ids = tok.encode(free + '<fn=add>{"b": 1}', add_special_tokens=False)
    assert not all(bad.accept(t) for t in ids)


def test_structural_tag_format_form_stops_after_the_first_tag(tok: Any, backend: Any) -> None:
    """The `format` form vLLM builds for strict tool calls: a `<tool_call>` trigger (text in
    this tokenizer, not a special token) starts the call, whose arguments obey the schema;
    `stop_after_first` lets nothing follow the first call."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}

    def spec(stop: bool) -> StructuredSpec:
        return StructuredSpec.from_params(structural_tag={
            "type": "structural_tag", "format": {
                "type": "triggered_tags", "triggers": ["<tool_call>"], "stop_after_first": stop,
                "tags": [{"type": "tag", "begin": '<tool_call>\n{"name": "f", "arguments": ',
                          "content": {"type": "json_schema", "json_schema": schema},
                          "end": "}\n</tool_call>"}]}})

    def takes(stop: bool, text: str) -> bool:
        m = backend.compile(spec(stop))
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        return all(m.accept(t) for t in ids)

    call = '<tool_call>\n{"name": "f", "arguments": {"a": 3}}\n</tool_call>'
    assert takes(False, f"Hi. {call} and {call}") and takes(True, f"Hi. {call}")
    assert takes(True, "no call at all")
    assert not takes(True, f"Hi. {call} and more")
    assert not takes(False, 'x <tool_call>\n{"name": "f", "arguments": {"b": 3}}')
    with pytest.raises(RequestRefused, match="at_least_one"):
        backend.compile(StructuredSpec.from_params(structural_tag={"format": {
            "type": "triggered_tags", "triggers": ["<f"], "at_least_one": True,
            "tags": [{"begin": "<f>", "content": {"type": "json_schema"}, "end": ""}]}}))

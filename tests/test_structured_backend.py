"""The structured-outputs backend (actors.core.structured) over the default model's real
tokenizer: walks matchers to termination by picking allowed tokens from the bitmask and
checks the decoded text against an independent validator (jsonschema, re, membership), plus
rollback, fast-forward tokens, refusals, the compile cache's bounds, and pathological specs.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")

import jsonschema  # noqa: E402

from actors.core.structured import (  # noqa: E402
    GrammarCache,
    StructuredSpec,
    bitmask_words,
    make_backend,
)
from actors.errors import RequestRefused  # noqa: E402


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    from actors.loader import DefaultModelMissing, prepare_model_dir

    try:
        model_dir = prepare_model_dir(None)[1]
    except DefaultModelMissing as e:
        pytest.skip(str(e))
    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def backend(tok: Any) -> Any:
    return make_backend("guidance", tok)


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
    (dict(json={"type": "objectx"}), "structured_outputs.json", "type"),
    (dict(json={"$ref": "#/$defs/missing"}), "structured_outputs.json", "missing"),
    (dict(json={"type": "string", "pattern": "(ab"}), "structured_outputs.json", "regex"),
    (dict(json={"type": "string", "pattern": "a(?=b)"}), "structured_outputs.json", "look"),
    (dict(json={"type": "object", "required": "a"}), "structured_outputs.json", "required"),
    # llguidance ignores these keywords; only the metaschema check refuses them
    (dict(json={"type": "string", "title": 5}), "structured_outputs.json", "$.title"),
    (dict(json={"$defs": {"unused": {"type": "wat"}}, "type": "integer"}),
     "structured_outputs.json", "$.$defs.unused.type"),
    (dict(json={"$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "string", "examples": 5}), "structured_outputs.json", "$.examples"),
    (dict(json="{not json"), "structured_outputs.json", "not valid JSON"),
    (dict(json="  "), "structured_outputs.json", "non-empty"),
    (dict(json="[1, 2]"), "structured_outputs.json", "object"),
    (dict(regex="(ab"), "structured_outputs.regex", "unclosed"),
    (dict(regex="a\x00b"), "structured_outputs.regex", "NUL"),
    (dict(grammar=""), "structured_outputs.grammar", "non-empty"),
    (dict(grammar="start: undefined_rule"), "structured_outputs.grammar", "undefined_rule"),
    (dict(grammar="this is ::: not ( a grammar"), "structured_outputs.grammar", "Lark"),
    (dict(choice=[]), "structured_outputs.choice", "non-empty"),
    (dict(choice=["a", 3]), "structured_outputs.choice", "strings"),
    (dict(json_object=False), "structured_outputs.json_object", "true"),
    (dict(json={"type": "string"}, whitespace_pattern="(("),
     "structured_outputs.whitespace_pattern", "whitespace_pattern"),
    (dict(structural_tag={"triggers": ["<f"], "structures": [
        {"begin": "<g>", "schema": {}, "end": "</g>"}]}), "structured_outputs.structural_tag",
     "trigger"),
    (dict(structural_tag="{}"), "structured_outputs.structural_tag", "triggers"),
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


# -- the compile cache --------------------------------------------------------------------

def test_cache_reuses_and_evicts(backend: Any) -> None:
    cache = GrammarCache(backend, capacity=2)
    a, b, c = (StructuredSpec.from_params(regex=r) for r in ("a+", "b+", "c+"))
    m1, m2 = cache.get(a), cache.get(a)
    assert m1 is not m2 and cache.stats()["misses"] == 1 and cache.stats()["hits"] == 1
    assert m1.accept(int(allowed(m1, backend.vocab_size)[-1]))  # m2 stays at the start
    assert len(allowed(m2, backend.vocab_size)) == len(allowed(cache.get(a), backend.vocab_size))
    cache.get(b)
    cache.get(c)
    assert a not in cache and b in cache and c in cache and len(cache) == 2
    cache.close()


def test_cache_keeps_refusals(backend: Any) -> None:
    cache = GrammarCache(backend)
    bad = StructuredSpec.from_params(json={"type": "object", "required": "a"})
    for _ in range(2):
        with pytest.raises(RequestRefused) as e:
            cache.get(bad)
        assert e.value.param == "structured_outputs.json"
    assert cache.stats()["misses"] == 1
    cache.close()


def _many_required(n: int) -> StructuredSpec:
    props = {f"p{i}": {"type": "integer"} for i in range(n)}
    return StructuredSpec.from_params(json={"type": "object", "properties": props,
                                            "required": list(props)})


def _settle(cache: GrammarCache) -> None:
    deadline = time.monotonic() + 30
    while cache.stats()["pending"] and time.monotonic() < deadline:
        time.sleep(0.02)


def test_cache_time_bound_refuses_and_remembers(backend: Any) -> None:
    cache = GrammarCache(backend, timeout_s=0.02)
    slow = _many_required(3000)  # a few hundred ms to compile
    t0 = time.monotonic()
    with pytest.raises(RequestRefused) as e:
        cache.get(slow)
    assert time.monotonic() - t0 < 1.0
    assert e.value.param == "structured_outputs.json"
    assert "took longer than 0.02 s" in e.value.message
    _settle(cache)  # the compile finished in the background, past the bound: refused again
    t0 = time.monotonic()
    with pytest.raises(RequestRefused, match="took longer than"):
        cache.get(slow)
    assert time.monotonic() - t0 < 0.1 and cache.stats()["misses"] == 1
    cache.close()


async def test_cache_async_shares_one_compile(backend: Any) -> None:
    import trio

    cache = GrammarCache(backend)
    spec = StructuredSpec.from_params(json=SCHEMA)
    got: list[Any] = []

    async def one() -> None:
        got.append(await cache.aget(spec))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
    assert len(got) == 4 and len({id(m) for m in got}) == 4
    assert cache.stats()["misses"] == 1
    slow = GrammarCache(backend, timeout_s=0.02)
    with pytest.raises(RequestRefused, match="took longer than"):
        await slow.aget(_many_required(3000))
    cache.close()
    slow.close()


# -- pathological specs: refused quickly, or compiled within the default bound -------------

QUICK_S = 1.0  # a refusal's budget (generous: the CI machine is shared)


def _compile_timed(backend: Any, spec: StructuredSpec) -> tuple[GrammarCache, float]:
    """A cache (the default 10 s bound) holding ``spec``, and how long the compile took."""
    cache = GrammarCache(backend)
    t0 = time.monotonic()
    cache.get(spec)
    return cache, time.monotonic() - t0


def _refused_timed(backend: Any, spec: StructuredSpec) -> RequestRefused:
    cache = GrammarCache(backend)
    t0 = time.monotonic()
    with pytest.raises(RequestRefused) as e:
        cache.get(spec)
    assert time.monotonic() - t0 < QUICK_S
    cache.close()
    return e.value


def test_catastrophic_backtracking_regex_compiles(tok: Any, backend: Any) -> None:
    # a backtracking engine explodes on (a+)+$; llguidance's lexer is a lazy DFA
    spec = StructuredSpec.from_params(regex=r"(a+)+$")
    cache, seconds = _compile_timed(backend, spec)
    assert seconds < QUICK_S
    for seed in (None, 31, 32):
        out = text(tok, backend, walk(backend, cache.get(spec), seed))
        assert re.fullmatch(r"(a+)+", out), out


def test_ten_thousand_member_enum_and_choice(tok: Any, backend: Any) -> None:
    members = [f"value_{i:05d}" for i in range(10_000)]
    for spec in (StructuredSpec.from_params(json={"enum": members}),
                 StructuredSpec.from_params(choice=members)):
        cache, seconds = _compile_timed(backend, spec)
        assert seconds < 5.0
        for seed in (33, 34):
            out = text(tok, backend, walk(backend, cache.get(spec), seed))
            value = json.loads(out) if spec.kind == "json" else out
            assert value in members, out


def test_five_thousand_properties(tok: Any, backend: Any) -> None:
    props = {f"p{i}": {"type": "integer"} for i in range(5000)}
    err = _refused_timed(backend, StructuredSpec.from_params(
        json={"type": "object", "properties": props}))
    assert err.param == "structured_outputs.json" and "optional properties" in err.message
    spec = _many_required(5000)  # all required: compiles
    cache, seconds = _compile_timed(backend, spec)
    assert seconds < 10.0
    forced = cache.get(spec).forced_tokens()
    assert tok.decode(forced).startswith('{"p0"') or '{"p0"'.startswith(tok.decode(forced))


def test_deep_nesting(tok: Any, backend: Any) -> None:
    def nested(depth: int) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 9}
        for _ in range(depth):
            s = {"type": "object", "properties": {"x": s}, "required": ["x"],
                 "additionalProperties": False}
        return s

    err = _refused_timed(backend, StructuredSpec.from_params(json=nested(200)))
    assert err.param == "structured_outputs.json" and "nested too deeply" in err.message
    schema = nested(30)  # 30 objects = 60 JSON levels (each adds "properties" too)
    spec = StructuredSpec.from_params(json=schema, disable_any_whitespace=True)
    cache, seconds = _compile_timed(backend, spec)
    assert seconds < QUICK_S
    conforms(json.loads(text(tok, backend, walk(backend, cache.get(spec)))), schema)


def test_two_thousand_way_any_of(tok: Any, backend: Any) -> None:
    def any_of(n: int) -> dict[str, Any]:
        return {"anyOf": [{"type": "object", "properties": {f"k{i}": {
            "type": "string", "maxLength": 4}}, "required": [f"k{i}"],
            "additionalProperties": False} for i in range(n)]}

    schema = any_of(2000)
    spec = StructuredSpec.from_params(json=schema, whitespace_pattern=r"[ ]?")
    cache, seconds = _compile_timed(backend, spec)
    assert seconds < 5.0
    for seed in (None, 35):
        conforms(json.loads(text(tok, backend, walk(backend, cache.get(spec), seed))),
                            schema)
    err = _refused_timed(backend, StructuredSpec.from_params(json=any_of(2001)))
    assert err.param == "structured_outputs.json" and "2001 branches" in err.message


def test_bench_script_runs(tok: Any) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_structured.py"
    spec = importlib.util.spec_from_file_location("bench_structured", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.run(tok, ["guidance"], repeats=2)
    g = out["guidance"]
    assert g["compile_ms_median"] > 0 and g["fill_bitmask_ms_median"] > 0
    assert g["tokens_per_walk"] > 10

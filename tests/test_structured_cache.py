"""The structured-outputs compile cache (LRU, shared compiles, the time bound, cached
refusals), the pathological specs each refused quickly or compiled within the default
bound, the benchmark script, and the optional xgrammar backend, over the default model's
tokenizer.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")

from actors.core.structured import GrammarCache, StructuredSpec, make_backend
from actors.errors import RequestRefused
from structured_helpers import (
    ARITH_GBNF,
    SCHEMA,
    allowed,
    backend,
    conforms,
    text,
    tok,
    walk,
    xgr_backend,
)

__all__ = ["backend", "tok", "xgr_backend"]  # fixtures


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


# -- backend selection and the optional xgrammar backend -----------------------------------

def test_backend_selection(tok: Any, backend: Any) -> None:
    assert make_backend("auto", tok).name == "guidance"
    with pytest.raises(ValueError, match="unknown"):
        make_backend("outlines", tok)


@pytest.mark.parametrize("seed", [None, 41, 42])
def test_xgrammar_walks_validate(tok: Any, xgr_backend: Any, seed: int | None) -> None:
    b = xgr_backend
    out = text(tok, b, walk(b, b.compile(StructuredSpec.from_params(
        json=SCHEMA, disable_any_whitespace=True)), seed))
    conforms(json.loads(out), SCHEMA)
    pattern = r"[a-z]{2,6}@[a-z]{2,6}\.(com|org|net)"
    out = text(tok, b, walk(b, b.compile(StructuredSpec.from_params(regex=pattern)), seed))
    assert re.fullmatch(pattern, out), out
    choices = ["a", "ab", 'say "hi"', "back\\slash", "café ☕"]
    out = text(tok, b, walk(b, b.compile(StructuredSpec.from_params(choice=choices)), seed))
    assert out in choices, out
    out = text(tok, b, walk(b, b.compile(StructuredSpec.from_params(grammar=ARITH_GBNF)), seed))
    assert re.fullmatch(r"[1-9][0-9]?([-+][1-9][0-9]?)*", out), out


def test_xgrammar_rollback_forced_and_refusals(tok: Any, xgr_backend: Any) -> None:
    b = xgr_backend
    spec = StructuredSpec.from_params(json=SCHEMA, disable_any_whitespace=True)
    ids = walk(b, b.compile(spec), seed=43)
    m = b.compile(spec)
    masks = []
    for t in ids:
        masks.append(allowed(m, b.vocab_size))
        assert m.accept(t)
    m.rollback(4)
    assert not m.is_terminated()
    np.testing.assert_array_equal(allowed(m, b.vocab_size), masks[len(ids) - 4])
    key = "an_extremely_long_property_name_that_is_fixed"
    m = b.compile(StructuredSpec.from_params(json={
        "type": "object", "properties": {key: {"type": "boolean"}}, "required": [key]},
        disable_any_whitespace=True))
    forced = m.forced_tokens()
    assert forced and f'{{"{key}":'.startswith(tok.decode(forced))
    assert all(m.accept(t) for t in forced)
    for kwargs, param in [({"regex": "(ab"}, "structured_outputs.regex"),
                          ({"json": {"type": "objectx"}}, "structured_outputs.json"),
                          ({"grammar": "start: foo"}, "structured_outputs.grammar"),
                          ({"json": {"type": "string"}, "whitespace_pattern": " "},
                           "structured_outputs.whitespace_pattern")]:
        with pytest.raises(RequestRefused) as e:
            b.compile(StructuredSpec.from_params(**kwargs))
        assert e.value.param == param

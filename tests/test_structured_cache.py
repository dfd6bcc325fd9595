"""The structured-outputs compile cache (LRU, shared compiles, the time bound, cached
refusals; its queue's bound, order and dropped compiles; pins and holds; the size bounds),
the engine that never compiles on its callers' threads, the pathological specs each refused
quickly or compiled within the default bound, the benchmark script, and the optional
xgrammar backend, over the default model's tokenizer.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")

from actors.core.structured import (
    GrammarBackend,
    GrammarCache,
    Matcher,
    StructuredSpec,
    bitmask_words,
    make_backend,
)
from actors.core.structured.cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_SUBSCHEMAS,
    CompileQueueFull,
)
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
    cache = GrammarCache(backend, timeout_s=0.1)
    slow = _many_required(5000)  # about half a second to compile
    t0 = time.monotonic()
    with pytest.raises(RequestRefused) as e:
        cache.get(slow)
    assert time.monotonic() - t0 < 1.0
    assert e.value.param == "structured_outputs.json"
    assert "took longer than 0.1 s" in e.value.message
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
    slow = GrammarCache(backend, timeout_s=0.1)
    with pytest.raises(RequestRefused, match="took longer than"):
        await slow.aget(_many_required(5000))
    cache.close()
    slow.close()


# -- the compile queue: bounded, smallest first, abandoned compiles dropped, pins ----------

class Gated(GrammarBackend):
    """The real backend behind a gate: every compile waits until the test opens it, and
    the specs compiled are recorded in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.gate = threading.Event()
        self.running = threading.Event()
        self.compiled: list[StructuredSpec] = []

    @property
    def tokenizer_key(self) -> str:
        return self.inner.tokenizer_key

    def compile_grammar(self, spec: StructuredSpec) -> Any:
        self.running.set()
        assert self.gate.wait(30)
        self.compiled.append(spec)
        return self.inner.compile_grammar(spec)


def _regex(n: int) -> StructuredSpec:
    """A spec of about ``n`` bytes (sizes order the queue)."""
    return StructuredSpec.from_params(regex="a" * n + "b+")


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _wait_for(cond: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_bounded_queue_refuses_or_takes_a_larger_ones_place(backend: Any) -> None:
    gated = Gated(backend)
    cache = GrammarCache(gated, workers=1)
    max_pending = 2
    running, big, huge, small = _regex(10), _regex(500), _regex(900), _regex(100)
    t_run, out_run = _in_thread(cache.get, running, max_pending)
    assert gated.running.wait(10)
    t_big, out_big = _in_thread(cache.get, big, max_pending)
    _wait_for(lambda: cache.stats()["pending"] == 2)
    # full, and nothing queued is larger than it: refused at once, nothing queued
    t0 = time.monotonic()
    with pytest.raises(CompileQueueFull) as e:
        cache.get(huge, max_pending)
    assert time.monotonic() - t0 < 0.5 and e.value.retry_after >= 1
    # full, but a larger one is queued: it takes that one's place, whose waiter is told
    t_small, out_small = _in_thread(cache.get, small, max_pending)
    t_big.join(10)
    assert isinstance(out_big.get("error"), CompileQueueFull), out_big
    assert cache.stats()["pending"] == 2 and cache.stats()["turned_away"] == 2
    gated.gate.set()
    for t in (t_run, t_small):
        t.join(30)
    assert "value" in out_run and "value" in out_small
    assert gated.compiled == [running, small]  # the displaced and the refused never ran
    assert big not in cache and huge not in cache
    # without a bound (the engine's side) nothing is turned away
    assert cache.get(huge) is not None
    cache.close()


def test_smallest_spec_compiles_first(backend: Any) -> None:
    gated = Gated(backend)
    cache = GrammarCache(gated, workers=1)
    first, large, small = _regex(1), _regex(800), _regex(50)
    threads = [_in_thread(cache.get, first)[0]]
    assert gated.running.wait(10)
    threads.append(_in_thread(cache.get, large)[0])
    _wait_for(lambda: cache.stats()["pending"] == 2)
    threads.append(_in_thread(cache.get, small)[0])
    _wait_for(lambda: cache.stats()["pending"] == 3)
    gated.gate.set()
    for t in threads:
        t.join(30)
    assert gated.compiled == [first, small, large]
    cache.close()


async def test_a_compile_whose_waiters_all_left_is_dropped(backend: Any) -> None:
    import trio

    gated = Gated(backend)
    cache = GrammarCache(gated, workers=1, timeout_s=0.3)
    blocker, left, waited = _regex(1), _regex(20), _regex(30)
    t_block, out_block = _in_thread(cache.get, blocker)
    assert gated.running.wait(10)
    # a waiter cancelled (its client went away) while its compile is queued
    with trio.move_on_after(0.1) as scope:
        await cache.aget(left)
    assert scope.cancelled_caught
    assert cache.stats()["dropped"] == 1 and cache.stats()["pending"] == 1
    # a waiter whose compile could not start within the bound: a 503, not the spec's fault
    t0 = time.monotonic()
    with pytest.raises(CompileQueueFull, match="could start within"):
        await cache.aget(waited)
    assert 0.25 < time.monotonic() - t0 < 2.0
    assert cache.stats()["dropped"] == 2 and cache.stats()["pending"] == 1
    gated.gate.set()
    t_block.join(30)
    assert "took longer than" in out_block["error"].message  # it ran, held at the gate
    _settle(cache)
    assert gated.compiled == [blocker] and left not in cache and waited not in cache
    # a later request for a dropped spec compiles it afresh
    assert await cache.aget(left) is not None and gated.compiled[-1] == left
    cache.close()


async def test_pinned_grammars_are_not_evicted(backend: Any) -> None:
    cache = GrammarCache(backend, capacity=2)
    a, b, c, d = (_regex(n) for n in (1, 2, 3, 4))
    pin = await cache.acompile(a)
    for spec in (b, c, d):
        cache.get(spec)
    assert a in cache and d in cache and b not in cache and c not in cache
    assert len(cache) == 2 and cache.stats()["pinned"] == 1
    pin.release()
    pin.release()  # idempotent
    cache.get(b)
    assert a not in cache and cache.stats()["pinned"] == 0
    # a pin taken on a refused spec is never handed out: the refusal is raised
    with pytest.raises(RequestRefused):
        await cache.acompile(StructuredSpec.from_params(regex="(ab"))
    cache.close()


def test_a_hold_never_waits_and_is_never_dropped(backend: Any) -> None:
    gated = Gated(backend)
    cache = GrammarCache(gated, workers=1)
    blocker, held, small = _regex(1), _regex(600), _regex(10)
    t_block, _ = _in_thread(cache.get, blocker)
    assert gated.running.wait(10)
    t0 = time.monotonic()
    hold = cache.hold(held)
    assert time.monotonic() - t0 < 0.05 and not hold.ready()
    # a full queue does not displace a held compile, even for a smaller spec
    with pytest.raises(CompileQueueFull):
        cache.get(small, max_pending=2)
    gated.gate.set()
    t_block.join(30)
    hold.future.result(timeout=30)
    assert hold.ready() and hold.grammar().matcher() is not None
    hold.release()
    assert held in cache and cache.hold(held).ready()  # a hit: ready at once
    # a hold released while its compile is still queued drops it
    gated.gate.clear()
    gated.running.clear()
    t_block, _ = _in_thread(cache.get, _regex(2))
    assert gated.running.wait(10)
    gone = cache.hold(_regex(700))
    gone.release()
    assert cache.stats()["dropped"] == 1
    gated.gate.set()
    t_block.join(30)
    cache.close()


@pytest.mark.parametrize("source,param", [("response_format", "response_format"),
                                          ("structured_outputs", "structured_outputs.json"),
                                          ("tools", "tools")])
def test_size_bounds_name_the_field(source: str, param: str) -> None:
    def spec(schema: dict[str, Any]) -> StructuredSpec:
        if source == "response_format":
            return StructuredSpec.from_response_format(
                {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        return StructuredSpec.from_params(json=schema, source=source)

    wide = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(100)}}
    assert spec(wide).size_bytes() == len(json.dumps(wide, separators=(",", ":")))
    spec(wide).check_size(10_000, 102)  # 102 objects: the root, properties, 100 values
    with pytest.raises(RequestRefused) as e:
        spec(wide).check_size(10_000, 101)
    assert e.value.param == param and "more than 101 subschemas" in e.value.message
    with pytest.raises(RequestRefused) as e:
        spec(wide).check_size(1000, None)
    assert e.value.param == param and "at most 1000 bytes" in e.value.message
    # enum, const, default and examples hold data: their objects are not subschemas
    data = {"enum": [{"a": i} for i in range(500)], "default": {"x": {}},
            "examples": [{}, {}], "const": {"b": {}}}
    spec(data).check_size(None, 1)
    regex = StructuredSpec.from_params(regex="a" * 2000)
    with pytest.raises(RequestRefused) as e:
        regex.check_size(1999, 1)
    assert e.value.param == "structured_outputs.regex"
    choice = StructuredSpec.from_params(choice=["ab", "é"])
    assert choice.size_bytes() == 3 + 3


def test_server_defaults_are_the_cache_defaults() -> None:
    from server.config import ServerConfig

    config = ServerConfig()
    assert (config.max_grammar_bytes, config.max_grammar_subschemas,
            config.max_pending_grammars) == (DEFAULT_MAX_BYTES, DEFAULT_MAX_SUBSCHEMAS,
                                             DEFAULT_MAX_PENDING)


# -- a matcher that raises ends its choice's request, never the step ---------------------

class Raising(Matcher):
    """A matcher that follows ``inner`` until its ``what`` call, which raises."""

    def __init__(self, inner: Any, what: str, after: int = 0) -> None:
        self.inner, self.what, self.after = inner, what, after

    def _maybe(self, what: str) -> None:
        if what == self.what:
            if self.after == 0:
                raise RuntimeError(f"{what} broke")
            self.after -= 1

    def fill_bitmask(self, out_row: Any) -> None:
        self.inner.fill_bitmask(out_row)

    def accept(self, token_id: int) -> bool:
        self._maybe("accept")
        return self.inner.accept(token_id)

    def rollback(self, k: int) -> None:
        self._maybe("rollback")
        self.inner.rollback(k)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def forced_tokens(self) -> list[int]:
        return self.inner.forced_tokens()


def test_mask_guards_accept_rollback_and_replay(backend: Any) -> None:
    from actors.core.structured.mask import EosOnlyMask, MatcherMask, mask_for

    vocab, eos = backend.vocab_size, tuple(backend.eos_token_ids)
    grammar = backend.compile_grammar(StructuredSpec.from_params(regex="[a-z]{5,9}"))
    letters = [int(t) for t in allowed(grammar.matcher(), vocab)[:3]]

    def eos_only(mask: Any) -> bool:
        row = np.full(bitmask_words(vocab), -1, np.int32)
        mask.fill_bitmask(row)
        ids = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])
        return set(ids.tolist()) == set(eos)

    mask = MatcherMask(Raising(grammar.matcher(), "accept", after=1), vocab, vocab, eos)
    mask.accept(letters[0])
    assert mask.failed is None and not eos_only(mask)
    mask.accept(letters[1])  # raises inside: recorded, not raised
    assert mask.failed is not None and "accept" in mask.failed and eos_only(mask)
    assert mask.fast_forward(8, lambda t: True) == []
    mask.rollback(1)  # inert once failed
    mask = MatcherMask(Raising(grammar.matcher(), "rollback"), vocab, vocab, eos)
    mask.accept(letters[0])
    mask.rollback(1)
    assert mask.failed is not None and "rollback" in mask.failed and eos_only(mask)
    # replay of a resumed choice stops at the failure; a matcher that cannot be built at all
    mask = mask_for(lambda: (Raising(grammar.matcher(), "accept", after=1), vocab), vocab, eos,
                    letters)
    assert mask.failed is not None
    def no_matcher() -> Any:
        raise RuntimeError("gone")
    mask = mask_for(no_matcher, vocab, eos, letters)
    assert isinstance(mask, EosOnlyMask) and mask.failed is not None and eos_only(mask)


class AcceptRaises:
    """A token mask (the sampler's protocol, not a MatcherMask) whose third accept raises."""

    def __init__(self) -> None:
        self.accepted = 0

    def fill_bitmask(self, row: np.ndarray) -> None:
        pass  # allows everything

    def accept(self, token_id: int) -> None:
        self.accepted += 1
        if self.accepted == 3:
            raise RuntimeError("accept broke")

    def rollback(self, num_tokens: int) -> None:
        pass


@pytest.mark.slow
def test_a_raising_token_mask_ends_only_its_request(tok: Any) -> None:
    from actors.core.runner.sampler import SamplingHooks
    from actors.messages import Admit, Generate
    from actors.params.sampling import SamplingParams
    from server_helpers import offline_llm

    engine = offline_llm().engine
    prompt = tuple(engine.tokenizer.encode("Once upon a time", add_special_tokens=False))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.runner.set_sampling_hooks("broken", 0, SamplingHooks(token_mask=AcceptRaises()))
    for rid in ("broken", "fine"):
        engine.add(Admit(rid, prompt, Generate(params), time.monotonic()))
    out = _run(engine)
    broken, fine = out["broken", 0], out["fine", 0]
    assert broken[-1].finish_reason == "error"
    assert sum(len(o.new_token_ids) for o in broken) == 2  # the third draw was refused
    assert fine[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in fine) == 8


# -- the engine never compiles on its callers' threads -------------------------------------

def _admit(engine: Any, request_id: str, spec: StructuredSpec | None, n: int = 1) -> Any:
    from actors.messages import Admit, Generate
    from actors.params.sampling import SamplingParams

    prompt = tuple(engine.tokenizer.encode("Answer in JSON:", add_special_tokens=False))
    params = SamplingParams(temperature=0.0, max_tokens=12, n=n, structured=spec)
    return Admit(request_id, prompt, Generate(params), time.monotonic())


def _run(engine: Any) -> dict[tuple[str, int], list[Any]]:
    out: dict[tuple[str, int], list[Any]] = {}
    deadline = time.monotonic() + 120
    while engine.has_unfinished():
        assert time.monotonic() < deadline
        for o in engine.step().outputs:
            out.setdefault((o.request_id, o.index), []).append(o)
    return out


@pytest.mark.slow
def test_engine_add_holds_a_request_whose_grammar_compiles(tok: Any) -> None:
    from actors.messages import Abort
    from server_helpers import offline_llm

    engine = offline_llm().engine
    engine.grammar_cache()  # the backend is built: only the compile is left
    spec = _many_required(5000)  # about half a second to compile
    nonce = uuid.uuid4().hex[:6]
    spec = StructuredSpec.from_params(json={**json.loads(spec.value), "title": nonce})
    t0 = time.monotonic()
    engine.add(_admit(engine, "held", spec, n=2))
    added = time.monotonic() - t0
    assert added < 0.05, f"add took {added:.3f} s"
    assert engine.has_unfinished() and engine.stats().num_waiting == 1
    assert not engine.scheduler.has_unfinished()  # held outside the scheduler
    # the id of a held request, or of a queued one, is taken for a request that would be held
    engine.add(_admit(engine, "plain", None))
    for rid in ("held", "plain"):
        with pytest.raises(RequestRefused, match="already in flight"):
            engine.add(_admit(engine, rid, StructuredSpec.from_params(regex=f"{rid}{nonce}")))
    for index in (2, 5):  # choices it does not have: nothing of it ends
        engine.abort(Abort("held", index))
    out = _run(engine)
    for i in range(2):
        text = tok.decode([t for o in out["held", i] for t in o.new_token_ids])
        assert text.startswith(('{"p0"', '{ "p0"')), text
        assert out["held", i][-1].finish_reason == "length"
    assert out["plain", 0][-1].finish_reason in ("length", "stop")
    # a spec the compile refuses: the request ends with "error", every choice
    bad = StructuredSpec.from_params(json={"type": "objectx", "title": nonce})
    engine.add(_admit(engine, "bad", bad, n=2))
    out = _run(engine)
    assert sorted(out) == [("bad", 0), ("bad", 1)]
    assert all(o[-1].finish_reason == "error" and o[-1].finished for o in out.values())
    # and once the refusal is known, add refuses it at once, as before
    with pytest.raises(RequestRefused):
        engine.add(_admit(engine, "bad again", bad))
    # what the scheduler would refuse is refused at add, not once its grammar has compiled
    slow = StructuredSpec.from_params(json={**json.loads(spec.value), "title": nonce + "n"})
    with pytest.raises(RequestRefused, match="max_num_seqs"):
        engine.add(_admit(engine, "too many", slow, n=engine.config.max_num_seqs + 1))
    assert not engine.has_unfinished()
    # aborted while held: nothing of it runs
    engine.add(_admit(engine, "gone", StructuredSpec.from_params(
        json={**json.loads(spec.value), "title": nonce + "x"})))
    assert not engine.scheduler.has_unfinished()
    engine.abort_request("gone")
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_the_step_never_compiles_an_evicted_grammar(tok: Any) -> None:
    from server_helpers import offline_llm

    engine = offline_llm().engine
    cache = engine.grammar_cache()
    spec = StructuredSpec.from_params(regex=f"[a-z]{{4}}-{uuid.uuid4().hex[:6]}")
    cache.get(spec)
    engine.add(_admit(engine, "evicted", spec, n=3))  # queued: its choices have no mask yet
    capacity, cache.capacity = cache.capacity, 1
    try:
        cache.get(_regex(3))  # evicts the request's grammar
    finally:
        cache.capacity = capacity
    assert spec not in cache
    misses = cache.stats()["misses"]
    out = _run(engine)
    assert cache.stats()["misses"] == misses and spec not in cache
    for i in range(3):
        text = tok.decode([t for o in out["evicted", i] for t in o.new_token_ids
                           if t not in engine.eos_token_ids])
        assert re.fullmatch(r"[a-z]{4}-[0-9a-f]{6}", text), text


@pytest.mark.slow
def test_a_child_process_core_answers_add_while_it_compiles(default_model: Any) -> None:
    from actors.config import EngineConfig
    from actors.core.process import ProcessEngineCore

    loaded = default_model[0]
    config = EngineConfig(model=str(loaded.source), dtype="float32", kv_cache_memory=64 << 20,
                          max_model_len=256, num_threads=1)
    with ProcessEngineCore(config) as core:
        spec = _many_required(5000)  # the child builds its backend, then compiles this
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(loaded.model_dir))
        from actors.messages import Admit, Generate
        from actors.params.sampling import SamplingParams

        prompt = tuple(tok.encode("Answer in JSON:", add_special_tokens=False))
        t0 = time.monotonic()
        core.add(Admit("child", prompt, Generate(SamplingParams(
            temperature=0.0, max_tokens=8, structured=spec)), 0.0))
        added = time.monotonic() - t0
        assert added < 0.2, f"add took {added:.3f} s"
        out = _run(core)
        text = tok.decode([t for o in out["child", 0] for t in o.new_token_ids])
        assert text.startswith(('{"p0"', '{ "p0"')), text


@pytest.mark.slow
def test_a_child_process_core_compiles_a_prepared_grammar_once(default_model: Any, tok: Any,
                                                                 backend: Any) -> None:
    """The front end's compile before admission runs in the core's process, once: the
    child's cache counts one compile, the parent's none, the child's add finds it pinned;
    a refusal comes back with the in-process cache's message and field."""
    import trio
    from actors.config import EngineConfig
    from actors.core.process import ProcessEngineCore
    from actors.core.structured.cache import shared_compiles
    from actors.messages import Admit, Generate, PrepareGrammar
    from actors.params.sampling import SamplingParams

    loaded = default_model[0]
    config = EngineConfig(model=str(loaded.source), dtype="float32", kv_cache_memory=64 << 20,
                          max_model_len=256, num_threads=1)
    with ProcessEngineCore(config) as core:
        info = core.info
        model = (info.model_dir, info.vocab_size, tuple(info.eos_token_ids))
        in_parent = shared_compiles(*model)
        nonce = uuid.uuid4().hex[:6]
        spec = StructuredSpec.from_params(regex=f"{nonce}-[a-z]{{4}}")

        async def prepare(s: StructuredSpec) -> Any:
            return await core.prepare_grammar(PrepareGrammar(s, DEFAULT_MAX_PENDING))

        verdict = trio.run(prepare, spec)
        assert verdict.outcome == "ok" and verdict.pin > 0
        assert core.stats().grammar_compiles == 1
        assert trio.run(prepare, spec).outcome == "ok"  # found compiled
        prompt = tuple(tok.encode("Answer:", add_special_tokens=False))
        core.add(Admit("prepared", prompt, Generate(SamplingParams(
            temperature=0.0, max_tokens=12, n=2, structured=spec)), 0.0))
        out = _run(core)
        for i in range(2):
            ids = [t for o in out["prepared", i] for t in o.new_token_ids
                   if t not in info.eos_token_ids]
            assert re.fullmatch(f"{nonce}-[a-z]{{4}}", tok.decode(ids))
        core.release_grammar(verdict.pin)
        core.release_grammar(verdict.pin + 1)
        core.release_grammar(verdict.pin)  # released twice, or unknown: ignored
        assert core.stats().grammar_compiles == 1  # the child's add did not compile again
        assert shared_compiles(*model) == in_parent  # and the parent compiled nothing
        bad = StructuredSpec.from_params(json={"type": "objectx", "title": nonce})
        refused = trio.run(prepare, bad)
        with pytest.raises(RequestRefused) as in_process:
            GrammarCache(backend).get(bad)
        assert (refused.outcome, refused.message, refused.param) == (
            "refused", in_process.value.message, in_process.value.param)


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

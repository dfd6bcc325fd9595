"""The engine's reasoning gate (actors.core.structured.gate.GatedMask) and its params.

Driven as the sampler drives a token mask (fill_bitmask, accept, fast_forward, rollback),
over the default model's tokenizer: a budget alone (no grammar) with a marker of several
tokens, and a real guidance matcher that must be neither consulted nor fed while the choice
reasons, and must start from its initial state after the end marker. Then the offline
engine with the default model: a JSON schema and a budget give free reasoning of exactly the
budget, the forced marker, and JSON that conforms, with fast-forward on and off alike.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")

from actors.core.structured import StructuredSpec, bitmask_words
from actors.core.structured.gate import GatedMask
from actors.core.structured.mask import mask_for
from actors.params.limits import RequestLimits
from actors.params.reasoning import ReasoningGate, reasoning_open_in
from actors.params.sampling import SamplingParams, SamplingParamsError
from structured_helpers import allowed, backend, conforms, tok

__all__ = ["backend", "tok"]  # fixtures

END = "</think>"
DIGITS = StructuredSpec.from_params(regex="[0-9]{2,6}")
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def ids(tok: Any, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False))


def row(vocab: int) -> np.ndarray:
    return np.full(bitmask_words(vocab), -1, np.int32)


def allows(mask: Any, vocab: int) -> np.ndarray:
    r = row(vocab)
    mask.fill_bitmask(r)
    return np.flatnonzero(np.unpackbits(r.view(np.uint8), bitorder="little")[:vocab])


def grammar(backend: Any, spec: StructuredSpec = DIGITS) -> Any:
    compiled = backend.compile_grammar(spec)
    return mask_for(lambda: (compiled.matcher(), backend.vocab_size), backend.vocab_size,
                    tuple(backend.eos_token_ids), ())


# -- the params -------------------------------------------------------------------------------

def test_gate_params_cross_processes_and_read_the_prompt() -> None:
    gate = ReasoningGate((5, 6), (3, 4), in_reasoning=True, thinking_token_budget=2,
                         prompt_markers=("<think>", "</think>", "<|im_start|>"))
    params = SamplingParams(reasoning_gate=gate)
    assert pickle.loads(pickle.dumps(params)) == params
    closed = "<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert gate.for_prompt(closed).in_reasoning is False
    assert gate.for_prompt(closed + "<|im_start|>assistant\n").in_reasoning is True  # neither
    assert gate.for_prompt("<|im_start|>assistant\n<think>\n").in_reasoning is True
    assert gate.for_prompt(closed).prompt_markers is None
    assert reasoning_open_in("a</think>b<think>", "<think>", "</think>", None) is True


@pytest.mark.parametrize("gate, fragment", [
    (ReasoningGate((1,), thinking_token_budget=-2), "non-negative"),
    (ReasoningGate(()), "no tokens"),
    (ReasoningGate((10**9,)), "out of vocabulary"),
])
def test_the_core_refuses_a_gate_it_cannot_follow(gate: ReasoningGate, fragment: str) -> None:
    with pytest.raises(SamplingParamsError, match=fragment) as info:
        SamplingParams(reasoning_gate=gate).validate(RequestLimits(vocab_size=1000))
    assert info.value.param == "thinking_token_budget"


# -- a budget alone ---------------------------------------------------------------------------

def test_budget_forces_a_marker_of_several_tokens(tok: Any) -> None:
    end, vocab = ids(tok, END), len(tok)
    assert len(end) > 1  # the default model has no </think> token
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=3), None)
    for t in ids(tok, "one two three"):
        assert len(allows(mask, vocab)) == vocab  # free while within the budget
        mask.accept(t)
    assert allows(mask, vocab).tolist() == [end[0]]
    assert mask.fast_forward(64, lambda t: True) == list(end)
    assert not mask.in_reasoning and len(allows(mask, vocab)) == vocab
    assert mask.fast_forward(64, lambda t: True) == []


def test_budget_zero_and_one_token_at_a_time(tok: Any) -> None:
    end, vocab = ids(tok, END), len(tok)
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=0), None)
    for t in end:  # no fast-forward (a row with logprobs): one forced token per step
        assert allows(mask, vocab).tolist() == [t]
        mask.accept(t)
    assert not mask.in_reasoning
    assert mask.fast_forward(1, lambda t: t != end[0]) == []  # nothing forced in content


def test_marker_written_before_the_budget_and_partly_at_it(tok: Any) -> None:
    end, vocab = ids(tok, END), len(tok)
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=50), None)
    for t in ids(tok, "short") + end:
        mask.accept(t)
    assert not mask.in_reasoning and mask.forced() is None
    # the model began the marker as the budget ran out: its next token is forced
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=2), None)
    for t in ids(tok, "a")[:1] + end[:1]:
        mask.accept(t)
    assert allows(mask, vocab).tolist() == [end[1]]
    # a refused forced token stops the jump
    assert mask.fast_forward(64, lambda t: t != end[1]) == []


def test_start_marker_counts_the_stretch_anew_and_reopens_reasoning(tok: Any) -> None:
    end, start = ids(tok, END), ids(tok, "<think>")
    mask = GatedMask(ReasoningGate(end, start, in_reasoning=False, thinking_token_budget=2),
                     None)
    mask.accept(ids(tok, "x")[0])
    assert not mask.in_reasoning and mask.forced() is None
    for t in start:
        mask.accept(t)
    assert mask.in_reasoning and mask.forced() is None  # the stretch starts after <think>
    mask.accept(ids(tok, "y")[0])
    for t in start:  # <think> again: counted anew, as vLLM counts from the last start
        mask.accept(t)
    assert mask.forced() is None
    mask.accept(ids(tok, "y")[0])
    mask.accept(ids(tok, "z")[0])
    assert mask.fast_forward(64, lambda t: True) == list(end)


def test_rollback_restores_the_phase_and_the_count(tok: Any) -> None:
    end, vocab = ids(tok, END), len(tok)
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=1), None)
    mask.accept(ids(tok, "x")[0])
    forced = mask.fast_forward(64, lambda t: True)
    mask.accept(ids(tok, "after")[0])
    assert forced == list(end) and not mask.in_reasoning
    mask.rollback(2)  # back to the middle of the marker
    assert mask.in_reasoning and allows(mask, vocab).tolist() == [end[-1]]
    mask.rollback(10)  # more than it holds: back to the start
    assert mask.in_reasoning and len(allows(mask, vocab)) == vocab


# -- with a grammar ---------------------------------------------------------------------------

def test_grammar_is_neither_consulted_nor_fed_while_reasoning(tok: Any, backend: Any) -> None:
    vocab, end = backend.vocab_size, ids(tok, END)
    fresh = allowed(grammar(backend), vocab)
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=None), grammar(backend))
    for t in ids(tok, "no digits here at all"):  # tokens the grammar would refuse
        assert len(allows(mask, vocab)) == vocab
        mask.accept(t)
    for t in end:
        mask.accept(t)
    assert mask.failed is None and not mask.in_reasoning
    assert np.array_equal(allows(mask, vocab), fresh)  # the grammar's initial state
    assert mask.fast_forward(64, lambda t: True) == []  # [0-9]{2,6} forces nothing yet
    for t in ids(tok, "42"):
        mask.accept(t)
    assert mask.failed is None and not allows(mask, vocab).tolist() == fresh.tolist()


def test_rollback_and_replay_across_the_marker(tok: Any, backend: Any) -> None:
    vocab, end = backend.vocab_size, ids(tok, END)
    outputs = list(ids(tok, "hmm")) + list(end) + list(ids(tok, "12"))
    live = GatedMask(ReasoningGate(end, thinking_token_budget=8), grammar(backend))
    for t in outputs:
        live.accept(t)
    after = allows(live, vocab)
    live.rollback(len(ids(tok, "12")) + 1)  # into the marker: the grammar is fresh again
    assert live.in_reasoning and len(allows(live, vocab)) == vocab
    for t in outputs[-len(ids(tok, "12")) - 1:]:
        live.accept(t)
    assert np.array_equal(allows(live, vocab), after)
    resumed = GatedMask(ReasoningGate(end, thinking_token_budget=8), grammar(backend))
    resumed.replay(outputs)  # a preempted sequence comes back with its outputs
    assert np.array_equal(allows(resumed, vocab), after)


def test_budget_hands_over_to_the_grammar_forced_tokens(tok: Any, backend: Any) -> None:
    vocab, end = backend.vocab_size, ids(tok, END)
    forced_start = StructuredSpec.from_params(regex='answer: [0-9]+')
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=1), grammar(backend, forced_start))
    mask.accept(ids(tok, "x")[0])
    forced = mask.fast_forward(64, lambda t: True)
    assert forced[:len(end)] == list(end) and len(forced) > len(end)
    assert tok.decode(forced[len(end):]).startswith("answer")


def test_constrain_reasoning_feeds_the_grammar_every_token(tok: Any, backend: Any) -> None:
    vocab, end = backend.vocab_size, ids(tok, END)
    whole = StructuredSpec.from_params(regex="[a-z]{1,8}</think>[0-9]{1,3}")
    mask = GatedMask(ReasoningGate(end, thinking_token_budget=1, constrain_reasoning=True),
                     grammar(backend, whole))
    first = int(allows(mask, vocab)[0])
    assert len(allows(mask, vocab)) < vocab  # the grammar binds the reasoning too
    mask.accept(first)
    # past the budget the marker is forced where the grammar allows it
    assert allows(mask, vocab).tolist() == [end[0]]


# -- the engine -------------------------------------------------------------------------------

MiB = 1 << 20


@pytest.fixture(scope="module")
def llms(default_model: tuple[Any, float]) -> tuple[Any, Any]:
    from actors.llm import LLM

    loaded = default_model[0]
    return tuple(LLM(str(loaded.source), loaded=loaded, dtype="float32",  # type: ignore
                     kv_cache_memory=128 * MiB, max_model_len=1024,
                     structured_fast_forward=ff) for ff in (True, False))


def test_engine_budget_then_schema(llms: tuple[Any, Any]) -> None:
    on, off = llms
    tokenizer = on.tokenizer
    end = ids(tokenizer, END)
    budget = 6
    params = SamplingParams(
        temperature=0.0, max_tokens=120,
        structured=StructuredSpec.from_params(json=SCHEMA),
        reasoning_gate=ReasoningGate(end, thinking_token_budget=budget))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Pick a colour and answer as JSON."}],
        add_generation_prompt=True, tokenize=False)
    outs = [llm.generate([prompt], params)[0].outputs[0] for llm in (on, off)]
    assert outs[0].token_ids == outs[1].token_ids
    got = list(outs[0].token_ids)
    assert tuple(got[budget:budget + len(end)]) == end, tokenizer.decode(got)
    assert END not in tokenizer.decode(got[:budget])
    content = tokenizer.decode(got[budget + len(end):], skip_special_tokens=True)
    conforms(json.loads(content), SCHEMA)
    assert outs[0].finish_reason == "stop"


# -- the flag ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["enable_in_reasoning=true", '{"enable_in_reasoning": true}',
                                  "backend=guidance,enable-in-reasoning=1"])
def test_structured_outputs_config_enable_in_reasoning(text: str) -> None:
    from server.cli import parse_args

    assert parse_args(["--structured-outputs-config", text]).structured_enable_in_reasoning
    assert not parse_args([]).structured_enable_in_reasoning
    with pytest.raises(SystemExit):
        parse_args(["--structured-outputs-config", "enable_in_reasoning=maybe"])

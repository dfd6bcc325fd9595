"""The engine's reasoning gate of one request (`SamplingParams.reasoning_gate`), filled from
the server's `--reasoning-parser`, as vLLM 0.34 gates structured outputs and
`thinking_token_budget` on the end of reasoning. Chat (and what shares its body: Anthropic,
batch), completions and Responses all pass their params through `gate_reasoning`.

A request gets a gate when a reasoning parser is on and the request has a constraint
(`structured_outputs`, `response_format`, a forced tool call) or a budget, and the parser
gives a rule for it (`ReasoningParser.gate_rule`: Qwen3 with `enable_thinking: false` reads
no reasoning, and gets none). The markers' token ids are the served tokenizer's encoding of
the parser's marker texts; whether the output starts in reasoning is the parser's rule,
applied to each rendered prompt where it is rendered (`ReasoningGate.for_prompt`).

The constraint binds from the first token instead (no gate, unless a budget needs one) with
`--structured-outputs-config enable_in_reasoning=true`, and with `include_reasoning: false`
(as vLLM resolves `reasoning_ended` for it). A budget is refused with vLLM's message when no
reasoning parser is on, or when the parser has no end marker the engine can follow
(granite, gpt_oss); -1 means no budget, as in vLLM.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from actors.params.reasoning import ReasoningGate, gate_error
from actors.params.sampling import SamplingParams

from server.errors import bad_request
from server.frontend.chat import reasoning

# vLLM's messages
BUDGET_RANGE = "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."
NO_REASONING = ("thinking_token_budget is set but reasoning_config is not configured. Please "
                "set --reasoning-parser and/or --reasoning-config to use thinking_token_budget.")


def thinking_budget(value: int | None) -> int | None:
    """The request's budget: None for unset or -1; a 400 below -1."""
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(BUDGET_RANGE, "thinking_token_budget")
    return value


def gate_reasoning(srv: Any, params: SamplingParams, *, budget: int | None,
                   template_kwargs: Mapping[str, Any] | None = None,
                   include_reasoning: bool = True) -> SamplingParams:
    """`params` with the request's reasoning gate, if it needs one (see the module's
    notes); `budget` as the request sent it."""
    budget = thinking_budget(budget)
    config = srv.config
    if config.reasoning_parser is None:
        if budget is not None:
            raise bad_request(NO_REASONING, "thinking_token_budget")
        return params
    parser = reasoning.get(config.reasoning_parser)
    if budget is not None and parser.end_marker is None:
        raise bad_request(f"thinking_token_budget needs a reasoning parser with an end marker; "
                          f"{config.reasoning_parser!r} has none", "thinking_token_budget")
    constrained = params.structured is not None
    if not constrained and budget is None:
        return params
    rule = parser(template_kwargs or {}, None).gate_rule()
    constrain_reasoning = config.structured_enable_in_reasoning or not include_reasoning
    if rule is None or (budget is None and constrain_reasoning):
        return params
    gate = ReasoningGate(
        end_token_ids=_token_ids(rule.end, srv.tokenizer),
        start_token_ids=() if rule.start is None else _token_ids(rule.start, srv.tokenizer),
        in_reasoning=rule.in_reasoning,
        thinking_token_budget=budget,
        constrain_reasoning=constrain_reasoning,
        prompt_markers=(None if rule.turn_boundary is None or rule.start is None
                        else (rule.start, rule.end, rule.turn_boundary)),
    )
    problem = gate_error(gate, srv.limits.vocab_size)
    if problem is not None:
        raise bad_request(problem, "thinking_token_budget")
    return dataclasses.replace(params, reasoning_gate=gate)


@functools.lru_cache(maxsize=32)
def _token_ids(text: str, tokenizer: Any) -> tuple[int, ...]:
    """The served tokenizer's encoding of a marker."""
    return tuple(tokenizer.encode(text, add_special_tokens=False))

"""What the engine follows of a choice's reasoning: ``ReasoningGate``, carried on
``SamplingParams.reasoning_gate``.

A server with a reasoning parser splits each output into reasoning and content by text. The
engine cannot read text, so the parser hands it the same structure as token ids: the
end-of-reasoning marker (``end_token_ids``, the tokenizer's encoding of e.g. ``</think>``),
the start marker that opens reasoning again (``start_token_ids``, may be empty), whether
the output starts inside reasoning, and the request's ``thinking_token_budget``. The engine
uses it two ways (``actors.core.structured.gate``):

- a structured-output constraint (a JSON schema, a regex, a forced tool call) binds only
  the content: while the choice reasons, its grammar matcher is neither consulted nor fed,
  and it starts from its initial state with the token after the end marker. With
  ``constrain_reasoning`` (``--structured-outputs-config enable_in_reasoning=true``) the
  constraint binds from the first token, as without a gate;
- after ``thinking_token_budget`` tokens of one stretch of reasoning, the end marker's
  tokens are forced one by one (0: at once), and the choice goes on in content.

Whether the output starts inside reasoning can depend on the rendered prompt (Qwen3's
template closes the reasoning in the prompt when thinking is off), which only exists once
the prompt is rendered, after the request's params are made. ``prompt_markers`` then holds
the text rule and ``for_prompt(text)`` applies it, per prompt, where the prompt is rendered
(the tokenizer actor): the prompt's last turn (after the last ``turn boundary``, when one
is given) decides when it shows a marker, the later of the two winning; ``in_reasoning``
holds otherwise. ``reasoning_open_in`` is that rule, shared with the server's parsers.

The value is frozen plain data: it crosses the engine-process boundary with its params.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ReasoningGate", "gate_error", "reasoning_open_in"]


def reasoning_open_in(prompt: str, start: str, end: str, turn_boundary: str | None
                      ) -> bool | None:
    """Whether the prompt's last turn leaves reasoning open (True: it opened `start` last,
    False: it closed it with `end` last); None when that turn shows neither."""
    if turn_boundary is not None:
        at = prompt.rfind(turn_boundary)
        if at != -1:
            prompt = prompt[at + len(turn_boundary):]
    opened, closed = prompt.rfind(start), prompt.rfind(end)
    if opened == closed:  # both -1
        return None
    return opened > closed


@dataclass(frozen=True, slots=True)
class ReasoningGate:
    """One request's reasoning as the engine follows it (see the module's notes)."""

    end_token_ids: tuple[int, ...]
    start_token_ids: tuple[int, ...] = ()
    in_reasoning: bool = True  # where the output starts (unless the prompt says)
    thinking_token_budget: int | None = None  # None: no budget
    constrain_reasoning: bool = False  # the constraint binds from the first token
    # (start text, end text, turn boundary or None): the prompt decides in_reasoning
    prompt_markers: tuple[str, str, str | None] | None = None

    def for_prompt(self, prompt: str) -> ReasoningGate:
        """The gate of a choice of this rendered prompt (itself without a prompt rule)."""
        if self.prompt_markers is None:
            return self
        start, end, boundary = self.prompt_markers
        opened = reasoning_open_in(prompt, start, end, boundary)
        return replace(self, prompt_markers=None,
                       in_reasoning=self.in_reasoning if opened is None else opened)


def gate_error(gate: object, vocab_size: int) -> str | None:
    """Why the engine cannot follow `gate` (None: it can, or there is no gate)."""
    if gate is None:
        return None
    if not isinstance(gate, ReasoningGate):
        return "reasoning_gate must be a ReasoningGate"
    budget = gate.thinking_token_budget
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                               or budget < 0):
        return "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."
    if not gate.end_token_ids:
        return "the reasoning parser's end marker has no tokens"
    for t in gate.end_token_ids + gate.start_token_ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            return (f"the reasoning marker token {t!r} is out of vocabulary "
                    f"(vocab size {vocab_size})")
    return None

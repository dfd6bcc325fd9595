"""`ChatRequest`: one chat request in no dialect's shape.

Each dialect builds one from its own body (`to_chat()`); the chat core reads only this:
the tool plan (`tools.plan_tools`) and the template render (`render.render_call`). It is
frozen, and holds plain values: messages and tools as the chat template receives them
(dicts in chat's shape: `role`, `content` as text or text parts, an assistant's
`tool_calls` with arguments as JSON text, a tool message's `tool_call_id`).

`tool_choice_given` tells an absent tool_choice from an explicit null: absent, the plan
defaults it as vLLM does ("auto" with tools, "none" without); null stays null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]
Tool = Mapping[str, Any]


@dataclass(frozen=True)
class ChatRequest:
    messages: Sequence[Message]
    tools: Sequence[Tool] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    tool_choice_given: bool = False
    parallel_tool_calls: bool | None = True
    # The request's structured_outputs object (a dict), when it has one: a constraint
    # there excludes a named or forced tool choice, as vLLM checks it.
    structured_outputs: Mapping[str, Any] | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    reasoning_effort: str | None = None
    documents: Sequence[Mapping[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False

    @property
    def effective_tool_choice(self) -> Any:
        """tool_choice as vLLM defaults it (see the module's docstring)."""
        if not self.tool_choice_given:
            return "auto" if self.tools else "none"
        return self.tool_choice

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the template and the tool plan receive them."""
        return None if self.tools is None else [dict(t) for t in self.tools]

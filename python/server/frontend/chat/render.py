"""The chat template's render call for a `ChatRequest`: every cheap check now (400s before
admission), the render itself deferred to the tokenizer actor's thread."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tools import history_messages
from server.frontend.chat_template import ChatRenderer


def render_call(renderer: ChatRenderer, chat: ChatRequest,
                tools: list[dict[str, Any]] | None = None) -> functools.partial[str]:
    """The deferred render of `chat`. ``tools``: what the template receives, when a tool
    plan has checked them (else the request's own)."""
    if tools is None:
        tools = chat.tool_dicts()
    return renderer.prepare(
        history_messages([dict(m) for m in chat.messages]),
        request_template=chat.chat_template,
        kwargs=template_kwargs(chat, renderer.default_kwargs, renderer.effort_map),
        add_generation_prompt=chat.add_generation_prompt,
        continue_final_message=chat.continue_final_message,
        tools=tools,
        documents=None if chat.documents is None else [dict(d) for d in chat.documents],
    )


def template_kwargs(chat: ChatRequest, defaults: Mapping[str, Any] | None = None,
                    effort_map: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """chat_template_kwargs over the server's `defaults` (--default-chat-template-kwargs),
    plus reasoning_effort as vLLM passes it on: rewritten by `effort_map`
    (--reasoning-effort-map; an effort it does not list passes unchanged), under its own
    name, and as enable_thinking (false only for "none", read after the rewrite) unless
    the request's own kwargs set that (a template that reads neither never sees them).
    The reasoning parser reads the same kwargs (`enable_thinking`, `thinking`)."""
    given = None if chat.chat_template_kwargs is None else dict(chat.chat_template_kwargs)
    effort = chat.reasoning_effort
    if effort is not None:
        effort = (effort_map or {}).get(effort, effort)
        given = dict(given or {}, reasoning_effort=effort)
        if "enable_thinking" not in (chat.chat_template_kwargs or {}):
            given["enable_thinking"] = effort != "none"
    if not defaults:
        return given
    return dict(defaults, **(given or {}))

"""Chat-template rendering in a sandboxed Jinja environment.

Template choice: the request's `chat_template` (only with --trust-request-chat-template),
else --chat-template (a file or a literal template), else the tokenizer's own (a GGUF's
tokenizer.chat_template, carried into the converted directory). With none of these (a base
model such as Gemma 3 270M) every chat request is a 400 with vLLM's message (its
ChatTemplateResolutionError: vLLM has fallback templates only for some vision and OCR
model types), and /v1/completions serves as usual. A request
may pass `chat_template_kwargs`, but only names the template actually reads, and never
the names the renderer itself controls.

A template is a program: it renders in server.frontend.template_sandbox, bounded in time, memory,
output and the size of every value it builds; whatever goes wrong in a render (the
template's own raise_exception, a bound, a recursion or memory error) is the request's
fault: a 400.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.errors import APIError, bad_request
from server.frontend.template_bounds import MAX_RENDERED_CHARS
from server.frontend.template_sandbox import (
    RENDER_TIMEOUT,
    BoundedEnvironment,
    RenderTimeout,
    RenderTooLarge,
    render_bounded,
)

# vLLM 0.34's message (renderers/hf.py) when no template is given and the model has none.
NO_TEMPLATE_MESSAGE = ("As of transformers v4.44, default chat template is no longer allowed, "
                       "so you must provide a chat template if the tokenizer does not define "
                       "one.")

# Names the renderer sets itself: a request can never override them.
RESERVED_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
     "tokenize", "chat_template", "bos_token", "eos_token", "return_dict", "tokenizer_kwargs",
     "raise_exception", "strftime_now", "range", "namespace", "loop"}
)  # fmt: skip
class _TemplateRaised(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> tuple[jinja2.Template, frozenset[str], bool]:
    env = _environment()
    try:
        ast = env.parse(source)
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise bad_request(f"the chat template does not parse: {exc.message}") from None
    variables = frozenset(meta.find_undeclared_variables(ast))
    return template, variables, _reads_content_parts(source)


def parse_template(source: str) -> str | None:
    """None when `source` parses as a chat template, else what is wrong with it."""
    try:
        _compile(source)
    except APIError as exc:
        return exc.message
    return None


def _reads_content_parts(source: str) -> bool:
    """Whether the template iterates message content as a list of parts (OpenAI format)."""
    return bool(
        re.search(r"for\s+\w+\s+in\s+(message|msg|m)(\[['\"]content['\"]\]|\.content)", source)
    )


def load_template_arg(value: str | None) -> str | None:
    """--chat-template: a path to a file, or the template text itself."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a template")
    return value


class ChatRenderer:
    def __init__(
        self,
        tokenizer: Any,
        *,
        template: str | None,
        content_format: str = "auto",
        trust_request_template: bool = False,
        default_kwargs: Mapping[str, Any] | None = None,
        effort_map: Mapping[str, str] | None = None,
    ) -> None:
        # --default-chat-template-kwargs: under every request's own kwargs, and
        # --reasoning-effort-map: the effort the template receives (render.py)
        self.default_kwargs: Mapping[str, Any] = dict(default_kwargs or {})
        self.effort_map: Mapping[str, str] = dict(effort_map or {})
        self._default = template or getattr(tokenizer, "chat_template", None)
        if isinstance(self._default, dict):  # named templates: take the default one
            self._default = self._default.get("default")
        self._content_format = content_format
        self._trust = trust_request_template
        self._bos = getattr(tokenizer, "bos_token", None) or ""
        self._eos = getattr(tokenizer, "eos_token", None) or ""
        if self._default is not None:
            _compile(self._default)  # fail at startup, not on the first request

    @property
    def template(self) -> str | None:
        return self._default

    def prepare(
        self,
        messages: list[dict[str, Any]],
        *,
        request_template: str | None,
        kwargs: dict[str, Any] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
    ) -> functools.partial[str]:
        """Check everything cheap now (400s before admission); return the render call."""
        kwargs = dict(kwargs or {})
        if "chat_template" in kwargs:
            request_template = request_template or kwargs.pop("chat_template")
        if request_template is not None and not self._trust:
            raise bad_request(
                "a request-supplied chat_template is not allowed on this server "
                "(start it with --trust-request-chat-template)",
                "chat_template",
            )
        if add_generation_prompt and continue_final_message:
            raise bad_request(
                "continue_final_message and add_generation_prompt cannot both be true",
                "continue_final_message",
            )
        source = request_template if request_template is not None else self._default
        if source is None:
            raise bad_request(NO_TEMPLATE_MESSAGE)
        if continue_final_message and (not messages or messages[-1]["role"] != "assistant"):
            raise bad_request(
                "continue_final_message needs the last message to be from the assistant",
                "continue_final_message",
            )
        template, variables, reads_parts = _compile(source)
        for key in kwargs:
            if key in RESERVED_KWARGS or not key.isidentifier():
                raise bad_request(
                    f"chat_template_kwargs may not set {key!r}", "chat_template_kwargs"
                )
        extra = {k: v for k, v in kwargs.items() if k in variables}
        parts = self._content_format == "openai" or (
            self._content_format == "auto" and reads_parts
        )
        msgs = [_normalise(m, parts, "developer" in variables or "developer" in source) for m in messages]
        context = dict(
            extra,
            messages=msgs,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._bos,
            eos_token=self._eos,
        )
        final = msgs[-1]["content"] if continue_final_message else None
        return functools.partial(_render, template, context, final)


def _normalise(message: dict[str, Any], parts: bool, knows_developer: bool) -> dict[str, Any]:
    msg = {k: v for k, v in message.items() if v is not None}
    if msg.get("role") == "developer" and not knows_developer:
        msg["role"] = "system"
    content = msg.get("content")
    if isinstance(content, list):
        for part in content:
            if part.get("type") != "text":
                raise bad_request(
                    f"content parts of type {part.get('type')!r} are not supported; "
                    "only text is",
                    "messages",
                )
        if not parts:
            msg["content"] = "\n".join(p.get("text") or "" for p in content)
    elif content is None:
        msg["content"] = "" if not parts else []
    elif parts:
        msg["content"] = [{"type": "text", "text": content}]
    return msg


def _render(template: jinja2.Template, context: dict[str, Any], final: Any) -> str:
    """Runs in the tokenizer's worker thread. Template failures become 400s."""
    try:
        text = render_bounded(template, context)
    except RenderTimeout:
        raise APIError(400, f"the chat template did not render within {RENDER_TIMEOUT:.0f} s") \
            from None
    except (RenderTooLarge, MemoryError):
        raise APIError(400, "the chat template needed more memory than a render may use") \
            from None
    except RecursionError:
        raise APIError(400, "the chat template recursed too deeply") from None
    except _TemplateRaised as exc:
        raise APIError(400, f"the chat template rejected the request: {exc}"[:500]) from None
    except jinja2.exceptions.SecurityError:
        raise APIError(400, "the chat template attempted an unsafe operation") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            OverflowError):  # OverflowError: the sandbox's range bound
        raise APIError(400, "the chat template could not be rendered for these messages") from None
    if len(text) > MAX_RENDERED_CHARS:
        raise APIError(400, "the rendered chat prompt is too long")
    if final is not None:
        final_text = final if isinstance(final, str) else "".join(
            p.get("text", "") for p in final
        )
        cut = text.rfind(final_text.strip()) if final_text.strip() else -1
        if cut >= 0:
            text = text[: cut + len(final_text.strip())]
    return text


def render_score_template(source: str, query: str, document: str, kwargs: dict[str, Any],
                          special: dict[str, str | None]) -> str:
    """A cross-encoder's score template (vLLM's --chat-template for /score and /rerank)
    over the two messages vLLM gives it, roles ``query`` and ``document``. ``special``:
    the tokenizer's bos_token and eos_token. Runs in a worker thread; failures are 400s,
    as a chat render's."""
    bad = sorted(k for k in kwargs if k in RESERVED_KWARGS or not k.isidentifier())
    if bad:
        raise bad_request(f"chat_template_kwargs contains reserved keys that conflict with "
                          f"fixed scorer arguments: {bad}", "chat_template_kwargs")
    template, _, _ = _compile(source)
    context = {**kwargs, **special, "add_generation_prompt": False,
               "messages": [{"role": "query", "content": query},
                            {"role": "document", "content": document}]}
    return _render(template, context, None)

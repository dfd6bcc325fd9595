"""Chat-template rendering in a sandboxed Jinja environment.

Template choice: the request's `chat_template` (only with --trust-request-chat-template),
else --chat-template (a file or a literal template), else the tokenizer's own. A request
may pass `chat_template_kwargs`, but only names the template actually reads, and never
the names the renderer itself controls.

A template is a program: besides the sandbox (no Python internals), a render is bounded in
time (RENDER_TIMEOUT), in output (MAX_RENDERED_CHARS, counted while it is produced) and in
the size of any one string or number it builds (`*` and `**` are checked before they run).
Rendering runs on the thread that prepares every prompt, so an unbounded template would
stall all requests, not just its own.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from datetime import datetime
from types import FrameType
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.errors import APIError, bad_request

# Names the renderer sets itself: a request can never override them.
RESERVED_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
     "tokenize", "chat_template", "bos_token", "eos_token", "return_dict", "tokenizer_kwargs",
     "raise_exception", "strftime_now", "range", "namespace", "loop"}
)  # fmt: skip
MAX_RENDERED_CHARS = 4 * 1024 * 1024
RENDER_TIMEOUT = 5.0  # seconds; real chat templates render in milliseconds
MAX_POWER_BITS = 4096  # largest integer `**` may build


class _TemplateRaised(Exception):
    pass


class _RenderTimeout(Exception):
    pass


_NUMBER = re.compile(r"\d+")


def _check_size(value: Any) -> None:
    """Refuses a number that would size a string beyond any chat prompt: a width, count or
    padding passed to a method or filter, or written in a format string."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and abs(value) > MAX_RENDERED_CHARS:
        raise jinja2.exceptions.SecurityError("a size argument is too large")
    if isinstance(value, str) and any(len(d) > 7 and int(d) > MAX_RENDERED_CHARS
                                      for d in _NUMBER.findall(value)):
        raise jinja2.exceptions.SecurityError("a format width is too large")


def _bounded_filter(fn: Any) -> Any:
    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        for v in (*args[1:], *kwargs.values()):
            _check_size(v)
        return fn(*args, **kwargs)
    return bounded


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every way a template can size a string checked before it
    allocates: `*`, `**` and `%`, call arguments (str.center, ljust, zfill, format...), and
    the padding filters. The output cap alone comes too late for a value that is built
    and then measured (`|length`) rather than printed."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("center", "indent", "wordwrap", "format", "truncate"):
            self.filters[name] = _bounded_filter(self.filters[name])

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        for v in (*args, *kwargs.values()):
            _check_size(v)
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        # The sandbox's hook for "...".format / format_map, at attribute access: the format
        # string's widths ("{:>1000000000}") are checked there; other strings are content.
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_size(value.__self__)
        return wrapped

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                    if len(seq) * max(times, 0) > MAX_RENDERED_CHARS:
                        raise jinja2.exceptions.SecurityError("repetition result too large")
        elif operator == "%" and isinstance(left, str):
            _check_size(left)  # "%1000000000s" % x
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS:
                raise jinja2.exceptions.SecurityError("power result too large")
        return super().call_binop(context, operator, left, right)


def _raise(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
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
    ) -> None:
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
        source = request_template if request_template is not None else self._default
        if source is None:
            raise bad_request(
                "this model has no chat template; use /v1/completions or start the server "
                "with --chat-template"
            )
        if add_generation_prompt and continue_final_message:
            raise bad_request(
                "continue_final_message and add_generation_prompt cannot both be true",
                "continue_final_message",
            )
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


def _render_bounded(template: jinja2.Template, context: dict[str, Any]) -> str:
    """template.render with a deadline and an output cap (in the calling thread only)."""
    deadline = time.monotonic() + RENDER_TIMEOUT

    def check(frame: FrameType, event: str, arg: Any) -> Any:
        # Called on every call in this thread and on every line of template code: loops
        # that print nothing still run lines, so no render can outlive the deadline.
        if time.monotonic() > deadline:
            raise _RenderTimeout()
        return check if frame.f_code.co_filename in template_files else None

    template_files = {template.filename or "<template>", "<template>"}

    previous = sys.gettrace()
    sys.settrace(check)
    try:
        pieces, size = [], 0
        for piece in template.generate(**context):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise APIError(400, "the rendered chat prompt is too long")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        sys.settrace(previous)


def _render(template: jinja2.Template, context: dict[str, Any], final: Any) -> str:
    """Runs in the tokenizer's worker thread. Template failures become 400s."""
    try:
        text = _render_bounded(template, context)
    except _RenderTimeout:
        raise APIError(400, f"the chat template did not render within {RENDER_TIMEOUT:.0f} s") \
            from None
    except _TemplateRaised as exc:
        raise APIError(400, f"the chat template rejected the request: {exc}"[:500]) from None
    except jinja2.exceptions.SecurityError:
        raise APIError(400, "the chat template attempted an unsafe operation") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError):
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

"""The sandbox chat templates render in: what a template may do, and how big and how long.

Besides jinja's sandbox (no Python internals), a render is bounded in time (RENDER_TIMEOUT,
checked on every template line), in memory growth (MAX_RENDER_GROWTH), in output
(MAX_RENDERED_CHARS, counted while it is produced) and in the size of any one value it
builds: `*` and `**`, size arguments, and every operation that can multiply its inputs are
checked before they run (server.frontend.template_bounds). Rendering runs on the thread that
prepares every prompt, so an unbounded template would stall all requests, not just its own.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from types import FrameType
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.frontend import template_bounds as bounds
from server.errors import APIError
from server.frontend.template_bounds import MAX_RENDERED_CHARS

RENDER_TIMEOUT = 5.0  # seconds; real chat templates render in milliseconds
MAX_POWER_BITS = 4096  # largest integer `**` may build
# Bytes the process may grow by while one template renders: the sizes checked before each
# operation bound one value, this bounds many (a loop that builds thousands of them).
MAX_RENDER_GROWTH = 512 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class RenderTimeout(Exception):
    pass


class RenderTooLarge(Exception):
    pass


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


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


def _check_chars(size: int | None) -> None:
    """Refuses an operation whose result (bounded by server.frontend.template_bounds) is
    too long."""
    if size is not None and size > MAX_RENDERED_CHARS:
        raise jinja2.exceptions.SecurityError("a string operation's result is too large")


def _bounded_filter(fn: Any, size: Any = None, *, widths: bool = True) -> Any:
    """A filter whose width arguments are checked (`widths`: every argument after the value,
    and after the environment or context a filter may take first) and, given `size` (the
    filter's own signature, returning a bound on the result's length), whose result is
    bounded."""
    skip = 2 if getattr(fn, "jinja_pass_arg", None) is not None else 1

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        for v in (*args[skip:], *kwargs.values()) if widths else ():
            _check_size(v)
        if size is not None:
            try:
                chars = size(*args, **kwargs)
            except TypeError:
                chars = None  # wrong arguments: the filter itself reports them
            _check_chars(chars)
        return fn(*args, **kwargs)
    return bounded


def _bounded_join(fn: Any) -> Any:
    @functools.wraps(fn)
    def bounded(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> Any:
        items = bounds.materialize(value)
        _check_chars(bounds.join_chars(str(d), items))
        return fn(eval_ctx, items, d, attribute)
    return bounded


# str methods whose result can be many times their inputs, and a bound on its length.
_METHOD_BOUNDS = {"replace": bounds.replace_chars, "expandtabs": bounds.expandtabs_chars}


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `a ~ b` to environment.bounded_concat, which measures before it joins."""

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every way a template can size a string checked before it
    allocates: `*`, `**` and `%`, call arguments (str.center, ljust, zfill, format...), and
    the padding filters; and every operation that can multiply its inputs (replace,
    expandtabs, join, format, `%`, `+`, `~`, tojson) has its result's length bounded first
    (server.frontend.template_bounds). The output cap alone comes too late for a value that is
    built and then measured (`|length`) rather than printed."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        f = self.filters
        for name in ("center", "truncate"):
            f[name] = _bounded_filter(f[name])
        f["indent"] = _bounded_filter(
            f["indent"], lambda s, width=4, *_, **__: bounds.indent_chars(str(s), width))
        f["wordwrap"] = _bounded_filter(
            f["wordwrap"], lambda _env, s, width=79, _long=True, wrapstring=None, *_, **__:
            bounds.wordwrap_chars(str(s), width, wrapstring))
        f["format"] = _bounded_filter(  # its arguments are values; widths are in the value
            f["format"], lambda value, *a, **k: bounds.percent_chars(str(value), k or a),
            widths=False)
        f["replace"] = _bounded_filter(
            f["replace"], lambda _ctx, s, old, new, count=None:
            bounds.replace_chars(str(s), old, new, -1 if count is None else count),
            widths=False)
        f["tojson"] = _bounded_filter(
            f["tojson"], lambda _ctx, value, indent=None: bounds.json_chars(value, indent))
        f["join"] = _bounded_join(f["join"])

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        for v in (*args, *kwargs.values()):
            _check_size(v)
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(obj, "__name__", "")
            if name == "join" and len(args) == 1 and not kwargs:
                args = (bounds.materialize(args[0]),)
                _check_chars(bounds.join_chars(owner, args[0]))
            elif name in _METHOD_BOUNDS:
                try:
                    chars = _METHOD_BOUNDS[name](owner, *args, **kwargs)
                except TypeError:
                    chars = None  # wrong arguments: the call itself reports them
                _check_chars(chars)
        return super().call(context, obj, *args, **kwargs)

    def bounded_concat(self, values: Any) -> str:
        pieces = [str(v) for v in values]
        _check_chars(sum(map(len, pieces)))
        return "".join(pieces)

    def wrap_str_format(self, value: Any) -> Any:
        # The sandbox's hook for "...".format / format_map, at attribute access: the format
        # string's widths ("{:>1000000000}") are checked there; other strings are content.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__
        _check_size(fmt)
        by_name = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> Any:
            mapping = args[0] if by_name and args and isinstance(args[0], dict) else {}
            _check_chars(bounds.format_chars(fmt, () if by_name else args,
                                             mapping if by_name else kwargs))
            return wrapped(*args, **kwargs)
        return bounded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                chars = bounds.repeat_chars(seq, times)
                if chars is not None and chars > MAX_RENDERED_CHARS:
                    raise jinja2.exceptions.SecurityError("repetition result too large")
        elif operator == "%" and isinstance(left, str):
            _check_size(left)  # "%1000000000s" % x
            _check_chars(bounds.percent_chars(left, right))
        elif operator == "+":
            _check_chars(bounds.concat_chars(left, right))
        elif (operator == "**" and isinstance(left, int) and isinstance(right, int)
              and right > 0 and abs(left) > 1
              and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS):
            raise jinja2.exceptions.SecurityError("power result too large")
        return super().call_binop(context, operator, left, right)


def render_bounded(template: jinja2.Template, context: dict[str, Any]) -> str:
    """template.render with a deadline, a cap on memory growth and an output cap (in the
    calling thread only)."""
    deadline = time.monotonic() + RENDER_TIMEOUT
    baseline = _resident_bytes()
    events = 0

    def check(frame: FrameType, event: str, arg: Any) -> Any:
        # Called on every call in this thread and on every line of template code: loops
        # that print nothing still run lines, so no render can outlive the deadline, and
        # every 64th event looks at the process's memory.
        nonlocal events
        if time.monotonic() > deadline:
            raise RenderTimeout()
        events += 1
        if baseline is not None and events % 64 == 0:
            now = _resident_bytes()
            if now is not None and now - baseline > MAX_RENDER_GROWTH:
                raise RenderTooLarge()
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

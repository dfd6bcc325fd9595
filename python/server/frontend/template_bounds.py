"""Upper bounds on the length of strings a chat template asks for, computed before they are
built.

A render's output is capped while it is produced, but a template can build a value and only
measure it (`|length`), and a few operations turn small inputs into huge strings:
`s.replace("", x)` inserts x len(s) + 1 times, `expandtabs(n)` turns every tab into n
spaces, `sep.join(items)` and `fmt.format(...)` / `fmt % args` repeat their pieces, `~` and
`+` double a string per loop turn. Each bound here is cheap (counts over the inputs, no
output built) and never below the true length, so a refusal is always for a string longer
than MAX_RENDERED_CHARS.
"""

from __future__ import annotations

import math

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

MAX_RENDERED_CHARS = 4 * 1024 * 1024

_NUMBER = re.compile(r"\d+")
# How many characters one character can become: repr() of printable ASCII at most doubles
# (backslashes), other characters up to '\U000e0000'; JSON (tojson) writes "<" as
# "\u003c" and an astral character as two "\uXXXX" escapes.
_GROWTH = {"r": (2, 10), "a": (2, 10), "j": (6, 12)}


def value_chars(value: Any, conversion: str | None = None) -> int:
    """At most how many characters str(value), repr(value) (conversion 'r' or 'a') or its
    JSON ('j') has; anything above MAX_RENDERED_CHARS is reported as MAX_RENDERED_CHARS + 1.
    Containers are summed item by item (never rendered), stopping at the cap."""
    too_many = MAX_RENDERED_CHARS + 1
    if isinstance(value, str):
        if conversion not in _GROWTH:
            return len(value)
        plain, other = _GROWTH[conversion]
        growth = plain if value.isascii() and value.isprintable() else other
        return growth * len(value) + 2
    if isinstance(value, (bool, int, float)) or value is None:
        if conversion == "j" and isinstance(value, float) and not math.isfinite(value):
            return 9  # JSON spells them Infinity, -Infinity, NaN: at most 9 characters
        return len(repr(value))
    if isinstance(value, (list, tuple, dict)):
        if 3 * len(value) > MAX_RENDERED_CHARS:  # ", " between items, at least one char each
            return too_many
        items = [x for kv in value.items() for x in kv] if isinstance(value, dict) else value
        total = 2
        for item in items:
            total += value_chars(item, "j" if conversion == "j" else "r") + 2
            if total > MAX_RENDERED_CHARS:
                return too_many
        return total
    return len(str(value))  # jinja's Undefined, Markup and the like


def json_chars(value: Any, indent: Any = None) -> int:
    """tojson: the JSON's characters, plus, when indented, an indent per nesting level on
    each of its lines (at most one line per character)."""
    chars = value_chars(value, "j")
    step = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if step <= 0 or chars > MAX_RENDERED_CHARS:
        return chars
    return chars + chars * step * _depth(value)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        return 0
    return 1 + max((_depth(v) for v in value), default=0)


def _max_number(text: str) -> int:
    return max((int(d) for d in _NUMBER.findall(text) if len(d) <= 12), default=0)


def replace_chars(s: str, old: Any, new: Any, count: Any = -1) -> int | None:
    if not (isinstance(old, str) and isinstance(new, str) and isinstance(count, int)):
        return None
    hits = s.count(old) if old else len(s) + 1
    if count is not None and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


def expandtabs_chars(s: str, tabsize: Any = 8) -> int | None:
    if not isinstance(tabsize, int):
        return None
    return len(s) + s.count("\t") * max(tabsize - 1, 0)


def join_chars(sep: str, items: list[Any]) -> int:
    return sum(value_chars(x) for x in items) + len(sep) * max(len(items) - 1, 0)


def format_chars(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """str.format / format_map: each replacement field is at most its widest argument, padded
    to the largest width or precision its spec can name (a number, or a nested field)."""
    values = [*args, *kwargs.values()]
    widest_int = max((abs(v) for v in values if isinstance(v, int)), default=0)
    size = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # a malformed format string raises when it runs
    for literal, name, spec, conversion in fields:
        size += len(literal)
        if name is None:
            continue
        spec = spec or ""
        pad = _max_number(spec)
        if "{" in spec:
            pad = max(pad, widest_int)
        size += max((value_chars(v, conversion) for v in values), default=0) + pad
    return size


def percent_chars(fmt: str, args: Any) -> int:
    """`fmt % args`: at most one directive per '%', each its widest value padded to the
    largest width or precision written in fmt (or passed for a '*')."""
    values = list(args.values()) if isinstance(args, Mapping) else (
        list(args) if isinstance(args, tuple) else [args])
    pad = _max_number(fmt)
    if "*" in fmt:
        pad = max([pad] + [abs(v) for v in values if isinstance(v, int)])
    widest = max((value_chars(v, "r") for v in values), default=0)
    return len(fmt) + fmt.count("%") * (widest + pad)


def indent_chars(s: str, width: Any = 4) -> int:
    step = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    return len(s) + (s.count("\n") + 1) * max(step, 0)


def wordwrap_chars(s: str, width: Any = 79, wrapstring: Any = None) -> int:
    breaks = len(s) // max(width, 1) + s.count(" ") + s.count("\n") + 1 \
        if isinstance(width, int) else len(s) + 1
    return len(s) + min(breaks, len(s) + 1) * len(wrapstring if isinstance(wrapstring, str)
                                                  else "\n")


def repeat_chars(seq: Any, times: Any) -> int | None:
    """`seq * times` for a string, list or tuple: its length, and for a list or tuple also
    the text it would make (str(), tojson, join), since the items are repeated with it."""
    if not isinstance(seq, (str, list, tuple)) or isinstance(times, bool) \
            or not isinstance(times, int):
        return None
    times = max(times, 0)
    if isinstance(seq, str) or not seq:
        return len(seq) * times
    return max(len(seq), value_chars(list(seq))) * times


def concat_chars(left: Any, right: Any) -> int | None:
    """`a + b` of two strings, lists or tuples: the sum of their lengths."""
    if isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
        return len(left) + len(right)
    return None


def materialize(items: Iterable[Any]) -> list[Any]:
    """An iterable's items as a list (so a join can be measured before it runs)."""
    return items if isinstance(items, list) else list(items)

"""How deeply a JSON body nests, measured on its bytes without recursion.

Request bodies are refused beyond MAX_JSON_DEPTH levels of arrays and objects before they
reach pydantic or a chat template: a deep value costs a recursion level per level in each of
them (a template's `tojson` of a few hundred levels raised RecursionError), while no request
field of the OpenAI API nests more than about 10 levels (a tool's JSON schema included).
JSON carried as a string inside the body (a tool call's `arguments`) is held to the same
bound before it is decoded: `text_nesting_depth`.
"""

from __future__ import annotations

import re

import numpy as np

MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as int8


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw`, which must be valid JSON.

    In valid JSON a backslash occurs only inside strings and escapes the byte after it, so
    dropping escaped backslashes, then escaped quotes, leaves quotes that only open and
    close strings; with the strings gone, every bracket left is structure. Each step is a
    bytes operation or a numpy scan: a 4 MiB body takes milliseconds.
    """
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets.translate(_STEPS), dtype=np.int8)
    return int(np.cumsum(steps, dtype=np.int32).max())


def text_nesting_depth(text: str) -> int:
    """`nesting_depth` of JSON text held in a str (JSON nested in a body as a string).

    The text need not be valid JSON: up to the first error the strings and brackets are
    read as a decoder reads them, so no decoder recurses deeper than this before it fails.
    """
    return nesting_depth(text.encode("utf-8", "surrogatepass"))

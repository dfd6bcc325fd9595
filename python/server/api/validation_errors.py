"""Turning pydantic validation errors into the API's 400 message (bounded in size)."""

from __future__ import annotations

from pydantic import ValidationError

MAX_ENTRIES = 10
MAX_MESSAGE = 1000
# A bound's error names its pydantic type too, as vLLM's message does (clients match on
# "greater_than_equal" / "less_than_equal" for an out-of-range seed, say).
_NAMED_TYPES = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def describe(exc: ValidationError) -> tuple[str, str | None]:
    """A short, client-safe description of what was wrong, and the first field named."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    lines = []
    for err in errors[:MAX_ENTRIES]:
        loc = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
        named = f" [type={err['type']}]" if err["type"] in _NAMED_TYPES else ""
        lines.append(f"{loc or 'body'}: {err['msg']}{named}")
    message = f"{len(errors)} validation error(s): " + "; ".join(lines)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    first = errors[0]["loc"] if errors else ()
    param = str(first[0]) if first else None
    return message, param


def _is_union_tag(part: object) -> bool:
    # pydantic names union members in loc ("str", "list[int]", ...); they confuse clients.
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"})

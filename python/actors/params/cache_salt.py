"""cache_salt: which prefix-cache namespace a request's blocks live in, and the rules a salt
keeps (SamplingParams.validate asks ``cache_salt_error``)."""

from __future__ import annotations

__all__ = ["MAX_CACHE_SALT_CHARS", "cache_salt_error"]

# vLLM 0.33's cache_salt rules (at most 128 characters, none of '@', '/', '\\', NUL) plus
# one of ours: printable characters only (no control or line-separator characters), so a
# salt is always safe to log and to pass to any other cache layer verbatim.
MAX_CACHE_SALT_CHARS = 128
_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def cache_salt_error(salt: object) -> str | None:
    """Why a cache_salt is refused (vLLM's messages), or None when it is acceptable."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return "Parameter 'cache_salt' must be a non-empty string if provided."
    if len(salt) > MAX_CACHE_SALT_CHARS or not _CACHE_SALT_FORBIDDEN.isdisjoint(salt):
        return (f"Parameter 'cache_salt' must be at most {MAX_CACHE_SALT_CHARS} characters "
                "and must not contain '@', '/', '\\\\', or NUL.")
    if not salt.isprintable():
        return "Parameter 'cache_salt' must contain printable characters only."
    return None

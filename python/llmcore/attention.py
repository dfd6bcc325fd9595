"""attention: filled in by its implementation."""

from __future__ import annotations

__all__: list[str] = []

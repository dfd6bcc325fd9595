"""The one loop of an OpenAI-shaped stream (chat, completions, and the scale-out generate
route that answers in their shapes): a renderer's chunks as `data:` events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

from actors.runtime.messages import ChoiceTiming

from server import sse
from server.errors import status_of_failure
from server.frontend.service import ChoiceDelta, Failed, Finished, Idle, TextGeneration, Usage


class ChunkRenderer(Protocol):
    def first_chunks(self) -> list[dict[str, Any]]: ...
    def chunk(self, delta: ChoiceDelta) -> dict[str, Any] | None: ...
    def final(self, usage: Usage, timing: ChoiceTiming | None = None
              ) -> dict[str, Any] | None: ...


async def sse_body(gen: TextGeneration, renderer: ChunkRenderer) -> AsyncIterator[bytes]:
    """An OpenAI stream: the renderer's chunks as `data:` events, a keep-alive comment while
    nothing comes, an error event if the request fails, then `data: [DONE]`. `finally`
    retires the request, also when the client disconnects."""
    try:
        for first in renderer.first_chunks():
            yield sse.event(first)
        async with aclosing(gen.stream(idle_after=sse.KEEPALIVE_INTERVAL)) as events:
            async for ev in events:
                if isinstance(ev, ChoiceDelta):
                    chunk = renderer.chunk(ev)
                    if chunk is not None:
                        yield sse.event(chunk)
                elif isinstance(ev, Idle):
                    yield sse.KEEPALIVE  # e.g. queued behind a long prefill
                elif isinstance(ev, Failed):
                    yield sse.error_event(status_of_failure(ev.failure), ev.message)
                elif isinstance(ev, Finished):
                    final = renderer.final(ev.usage, ev.timing)
                    if final is not None:
                        yield sse.event(final)
        yield sse.DONE
    finally:
        gen.retire()

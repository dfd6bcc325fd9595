"""A prompt's token ids without generating: the rendered text (a chat template's, or a prompt
as it is) tokenized in worker threads, TOKENIZE_THREADS at a time, with at most
TOKENIZE_QUEUE more waiting; beyond that 503 + Retry-After, as a full generation queue
answers (each waiting request holds its body, up to --max-body-bytes). /tokenize, the
Anthropic count_tokens route and the scale-out render routes share it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from server.errors import bad_request, overloaded
from server.state import ServerState

TOKENIZE_THREADS = 2
TOKENIZE_QUEUE = 16
_TOKENIZE_LIMITER = trio.CapacityLimiter(TOKENIZE_THREADS)


async def in_tokenizer_thread(fn: Any) -> Any:
    if _TOKENIZE_LIMITER.statistics().tasks_waiting >= TOKENIZE_QUEUE:
        raise overloaded()
    return await trio.to_thread.run_sync(fn, limiter=_TOKENIZE_LIMITER)


async def token_ids_of(srv: ServerState, render: Callable[[], str],
                       add_special_tokens: bool) -> list[int]:
    """What /tokenize gives: the rendered text (a chat template's, or a prompt as it is)
    tokenized in a tokenizer thread; text that cannot fit the context is refused
    untokenized, as generation refuses it."""
    ids, _ = await encoded(srv, render, add_special_tokens)
    return ids


async def encoded(srv: ServerState, render: Callable[[], str], add_special_tokens: bool,
                  ) -> tuple[list[int], list[tuple[int, int]]]:
    """token_ids_of's ids with each token's (start, end) character offsets in the rendered
    text ((0, 0) for a special token the tokenizer added)."""
    tok = srv.tokenizer

    def work() -> tuple[list[int], list[tuple[int, int]]]:
        text = render()
        too_long = srv.prompt_bound.error(text, srv.limits.max_model_len)
        if too_long is not None:
            raise bad_request(too_long, "prompt")
        enc = tok.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return enc.ids, enc.offsets

    return await in_tokenizer_thread(work)

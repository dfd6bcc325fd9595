"""Reading a Generation's Outbox into whole responses or SSE chunks (shared by both APIs)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from actors.runtime.outbox import ChoiceUpdate, OutboxFailed, TokenLogprob
from actors.text.detokenizer import TokenTexts
from server import sse
from server.errors import APIError
from server.generation import Generation

# -inf cannot be written in JSON; clients expect a large negative number (as vLLM sends).
MIN_LOGPROB = -9999.0


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    num_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


async def collect(gen: Generation) -> list[ChoiceResult]:
    """Read everything (non-streaming). A failure after admission becomes an APIError."""
    results = [ChoiceResult(i) for i in range(gen.state.num_choices)]
    outbox = gen.state.outbox
    while not outbox.done:
        try:
            updates = await outbox.get()
        except OutboxFailed as exc:
            raise APIError(exc.status, exc.message) from None
        for u in updates:
            r = results[u.index]
            r.text += u.text
            r.num_tokens += len(u.token_ids)
            r.token_ids.extend(u.token_ids)
            r.logprobs.extend(u.logprobs)
            if u.prompt_logprobs is not None:
                r.prompt_logprobs = u.prompt_logprobs
            if u.finish_reason is not None:
                r.finish_reason, r.stop_reason = u.finish_reason, u.stop_reason
    return results


def usage(gen: Generation, completion_tokens: int) -> dict[str, int]:
    """Usage of the whole request (every prompt, every choice)."""
    prompt = sum(len(p.token_ids) for p in gen.state.prompt_results)
    return _usage(prompt, completion_tokens)


def response_usage(gen: Generation, completion_tokens: int) -> dict[str, Any]:
    """Usage as a whole (non-streamed) response reports it: the details are null, as vLLM
    reports them unless --enable-prompt-tokens-details (not implemented here) is given."""
    return {**usage(gen, completion_tokens), "prompt_tokens_details": None}


def choice_usage(gen: Generation, index: int, completion_tokens: int) -> dict[str, int]:
    """continuous_usage_stats: one choice's own prompt and the tokens it generated so far."""
    n = gen.state.params.n
    prompt = len(gen.state.prompt_results[index // n].token_ids)
    return _usage(prompt, completion_tokens)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def sse_stream(
    gen: Generation,
    *,
    first_chunks: Callable[[], list[dict[str, Any]]],
    chunk_of: Callable[[ChoiceUpdate], dict[str, Any] | None],
    final_chunk: Callable[[dict[str, int]], dict[str, Any]] | None,
    continuous_usage: bool,
) -> AsyncIterator[bytes]:
    """The SSE body. `finally` retires the request, also when the client disconnects.

    With continuous_usage, every chunk carries the usage of the one choice it is about
    (its prompt, its tokens so far), as vLLM reports it.
    """
    generated = [0] * gen.state.num_choices
    try:
        for chunk in first_chunks():
            if continuous_usage:
                chunk["usage"] = choice_usage(gen, chunk["choices"][0]["index"], 0)
            yield sse.event(chunk)
        outbox = gen.state.outbox
        while not outbox.done:
            try:
                with trio.move_on_after(sse.KEEPALIVE_INTERVAL) as waiting:
                    updates = await outbox.get()  # cancel-safe: nothing is lost
            except OutboxFailed as exc:
                yield sse.error_event(exc.status, exc.message)
                break
            if waiting.cancelled_caught:
                yield sse.KEEPALIVE  # e.g. queued behind a long prefill
                continue
            for u in updates:
                generated[u.index] += len(u.token_ids)
                chunk = chunk_of(u)
                if chunk is None:
                    continue
                if continuous_usage:
                    chunk["usage"] = choice_usage(gen, u.index, generated[u.index])
                yield sse.event(chunk)
        else:
            if final_chunk is not None:
                yield sse.event(final_chunk(usage(gen, sum(generated))))
        yield sse.DONE
    finally:
        gen.retire()


def prompt_logprobs_of(results: list[ChoiceResult], index: int,
                       n: int) -> list[TokenLogprob | None] | None:
    """A choice's prompt logprobs: the first choice of each prompt carries them."""
    return results[index // n * n].prompt_logprobs


def prompt_logprobs_json(
    texts: TokenTexts, items: list[TokenLogprob | None] | None
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs`` field: per prompt token (the first None) a map of token
    id -> {logprob, rank, decoded_token}, the prompt token first, then the top ones."""
    if items is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in items:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): _lp_json(texts, lp.token_id, lp.logprob, lp.rank)}
        for r, (tid, v) in enumerate(lp.top, start=1):
            entry.setdefault(str(tid), _lp_json(texts, tid, v, r))
        out.append(entry)
    return out


def _lp_json(texts: TokenTexts, token_id: int, logprob: float, rank: int) -> dict[str, Any]:
    return {"logprob": max(logprob, MIN_LOGPROB), "rank": rank,
            "decoded_token": texts[token_id]}


def echo_prompt_logprobs(
    texts: TokenTexts, prompt_ids: list[int], prompt_items: list[TokenLogprob | None], num: int,
) -> dict[str, Any]:
    """echo with logprobs, the prompt's part (shared by the prompt's n choices): its tokens,
    the first without a logprob, text offsets counted from the start of the prompt."""
    head = completion_logprobs(texts, [], 0, num, first_token_id=prompt_ids[0])
    rest = [lp for lp in prompt_items[1:] if lp is not None]
    tail = completion_logprobs(texts, rest, len(head["tokens"][0]), num)
    return {k: head[k] + tail[k] for k in head}


def echo_logprobs(texts: TokenTexts, prompt_part: dict[str, Any], items: list[TokenLogprob],
                  num: int) -> dict[str, Any]:
    """echo with logprobs: the prompt's part, then the generated tokens, whose text offsets
    go on from the end of the echoed prompt."""
    end = prompt_part["text_offset"][-1] + len(prompt_part["tokens"][-1])
    generated = completion_logprobs(texts, items, end, num)
    return {k: prompt_part[k] + generated[k] for k in prompt_part}


def completion_logprobs(
    texts: TokenTexts, items: list[TokenLogprob], start_offset: int, num: int,
    first_token_id: int | None = None,
) -> dict[str, Any]:
    """The legacy completions layout. Each position's top_logprobs holds the sampled token
    and the `num` most likely ones (so num + 1 entries at most, one for logprobs=0), the
    sampled token first, as OpenAI's completions API and vLLM report them.
    ``first_token_id``: a leading token without a logprob (an echoed prompt's first)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = start_offset
    if first_token_id is not None:
        text = texts[first_token_id]
        tokens.append(text)
        token_lps.append(None)
        tops.append(None)
        offsets.append(offset)
        offset += len(text)
    for lp in items:
        text = texts[lp.token_id]
        tokens.append(text)
        token_lps.append(max(lp.logprob, MIN_LOGPROB))
        ranked = [(lp.token_id, lp.logprob)]
        ranked += [(t, v) for t, v in lp.top if t != lp.token_id]
        if num >= 0:
            ranked = ranked[: num + 1]
        tops.append({texts[t]: max(v, MIN_LOGPROB) for t, v in ranked})
        offsets.append(offset)
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": token_lps, "tokens": tokens,
            "top_logprobs": tops}


def chat_logprobs(texts: TokenTexts, items: list[TokenLogprob], top_n: int) -> dict[str, Any]:
    content = []
    for lp in items:
        text = texts[lp.token_id]
        content.append(
            {
                "token": text,
                "logprob": max(lp.logprob, MIN_LOGPROB),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": (t := texts[tid]),
                        "logprob": max(v, MIN_LOGPROB),
                        "bytes": list(t.encode("utf-8")),
                    }
                    for tid, v in (lp.top if top_n < 0 else lp.top[:top_n])  # -1: all
                ],
            }
        )
    return {"content": content}

"""OpenAI's usage and logprobs JSON, shared by the completions and chat renderers: the key
order vLLM writes, which entries are null, and -inf written as -9999.0; and vLLM's
per-request `metrics` object (--enable-per-request-metrics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from actors.runtime.messages import ChoiceTiming

from server.frontend.service import LogprobEntry, PromptLogprobs, Usage

# -inf cannot be written in JSON; clients expect a large negative number (as vLLM sends).
MIN_LOGPROB = -9999.0


# -- usage ----------------------------------------------------------------------------------
def usage_json(u: Usage) -> dict[str, int]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def response_usage_json(u: Usage) -> dict[str, Any]:
    """Usage as a whole (non-streamed) response reports it: the details are null, as vLLM
    reports them unless --enable-prompt-tokens-details (not implemented here) is given."""
    return {**usage_json(u), "prompt_tokens_details": None}


# -- per-request metrics --------------------------------------------------------------------
def metrics_json(timing: ChoiceTiming | None, generated: int, *,
                 stream: bool = False) -> dict[str, Any]:
    """vLLM's PerRequestMetrics from one choice's clock (the engine actor's ledger): TTFT
    from its scheduling to its first token, generation time from the first token to the
    last, queue time from the request's arrival to its scheduling, the mean gap between
    tokens, and tokens per second from scheduling to the last token. A field whose times
    are missing is null; a stream leaves the nulls out, as vLLM writes its chunks."""
    def ms(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else (end - start) * 1000.0

    queued, scheduled, first, last = (None, None, None, None) if timing is None else (
        timing.arrival, timing.scheduled, timing.first_token, timing.last_token)
    decode = ms(first, last)
    inference = ms(scheduled, last)
    out: dict[str, Any] = {
        "time_to_first_token_ms": ms(scheduled, first),
        "generation_time_ms": decode,
        "queue_time_ms": ms(queued, scheduled),
        "mean_itl_ms": decode / (generated - 1) if decode is not None and generated > 1
        else None,
        "tokens_per_second": generated / inference * 1000.0 if inference else None,
        "speculative_decoding": None,
    }
    return {k: v for k, v in out.items() if v is not None} if stream else out


# -- logprobs -------------------------------------------------------------------------------
def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def chat_logprobs(items: Iterable[LogprobEntry], top_n: int) -> dict[str, Any]:
    """Chat's layout: per token its text, logprob, UTF-8 bytes and the `top_n` most likely
    tokens (-1: all that were computed)."""
    content = []
    for lp in items:
        top = lp.top if top_n < 0 else lp.top[:top_n]
        content.append({
            "token": lp.text,
            "logprob": _clamped(lp.logprob),
            "bytes": list(lp.bytes),
            "top_logprobs": [{"token": t.text, "logprob": _clamped(t.logprob),
                              "bytes": list(t.bytes)} for t in top],
        })
    return {"content": content}


def completion_logprobs(items: Iterable[LogprobEntry], start_offset: int, num: int,
                        first_token: str | None = None) -> dict[str, Any]:
    """The legacy completions layout. Each position's top_logprobs holds the sampled token
    and the `num` most likely ones (so num + 1 entries at most, one for logprobs=0), the
    sampled token first, as OpenAI's completions API and vLLM report them.
    ``first_token``: the text of a leading token without a logprob (an echoed prompt's
    first)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = start_offset
    if first_token is not None:
        tokens.append(first_token)
        token_lps.append(None)
        tops.append(None)
        offsets.append(offset)
        offset += len(first_token)
    for lp in items:
        tokens.append(lp.text)
        token_lps.append(_clamped(lp.logprob))
        ranked = [(lp.text, lp.logprob)]
        ranked += [(t.text, t.logprob) for t in lp.top if t.token_id != lp.token_id]
        if num >= 0:
            ranked = ranked[: num + 1]
        tops.append({text: _clamped(v) for text, v in ranked})
        offsets.append(offset)
        offset += len(lp.text)
    return {"text_offset": offsets, "token_logprobs": token_lps, "tokens": tokens,
            "top_logprobs": tops}


def prompt_logprobs_json(
    items: PromptLogprobs | None,
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
        entry = {str(lp.token_id): _ranked_json(lp.text, lp.logprob, lp.rank)}
        for r, t in enumerate(lp.top, start=1):
            entry.setdefault(str(t.token_id), _ranked_json(t.text, t.logprob, r))
        out.append(entry)
    return out


def _ranked_json(text: str, logprob: float, rank: int) -> dict[str, Any]:
    return {"logprob": _clamped(logprob), "rank": rank, "decoded_token": text}


def echo_prompt_logprobs(first_token: str, prompt_items: PromptLogprobs,
                         num: int) -> dict[str, Any]:
    """echo with logprobs, the prompt's part (shared by the prompt's n choices): its tokens,
    the first without a logprob, text offsets counted from the start of the prompt."""
    head = completion_logprobs([], 0, num, first_token=first_token)
    rest = [lp for lp in prompt_items[1:] if lp is not None]
    tail = completion_logprobs(rest, len(head["tokens"][0]), num)
    return {k: head[k] + tail[k] for k in head}


def echo_logprobs(prompt_part: dict[str, Any], items: Iterable[LogprobEntry],
                  num: int) -> dict[str, Any]:
    """echo with logprobs: the prompt's part, then the generated tokens, whose text offsets
    go on from the end of the echoed prompt."""
    end = prompt_part["text_offset"][-1] + len(prompt_part["tokens"][-1])
    generated = completion_logprobs(items, end, num)
    return {k: prompt_part[k] + generated[k] for k in prompt_part}


# -- the SSE body ---------------------------------------------------------------------------

"""OpenAI's usage and logprobs JSON, shared by the completions and chat renderers: the key
order vLLM writes, which entries are null, and -inf written as -9999.0; and vLLM's
per-request `metrics` object (--enable-per-request-metrics)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from actors.runtime.messages import ChoiceTiming

from server.frontend.logprobs import LogprobEntry, PromptLogprobs
from server.frontend.service import Usage

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
@dataclass(frozen=True, slots=True)
class LogprobStyle:
    """How a request asked its logprobs to be written. ``as_token_ids``: each token is
    "token_id:<id>" instead of its text (vLLM's return_tokens_as_token_ids; completions'
    text offsets then count those strings, as vLLM counts them). ``listed``: the entries
    are logprob_token_ids' (all of them, after the sampled token), not the top ones."""

    as_token_ids: bool = False
    listed: bool = False

    def name(self, token_id: int, text: str) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else text


PLAIN = LogprobStyle()


def logprob_style(as_token_ids: bool | None, server_default: bool,
                  listed: list[int] | None) -> LogprobStyle:
    """A request's style: its return_tokens_as_token_ids, else the server's
    --return-tokens-as-token-ids; listed when it sets logprob_token_ids."""
    return LogprobStyle(server_default if as_token_ids is None else as_token_ids, bool(listed))


def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def chat_logprobs(items: Iterable[LogprobEntry], top_n: int,
                  style: LogprobStyle = PLAIN) -> dict[str, Any]:
    """Chat's layout: per token its text, logprob, UTF-8 bytes and the `top_n` most likely
    tokens (-1: all that were computed). Listed ids: the sampled token, then each listed id
    once, as vLLM lists them. A token's bytes are its text's; a top entry's are those of
    the string it is written as (vLLM's)."""
    content = []
    for lp in items:
        if style.listed:
            seen = {lp.token_id}
            top = [(lp.token_id, lp.text, lp.logprob)]
            for t in lp.top:
                if t.token_id not in seen:
                    seen.add(t.token_id)
                    top.append((t.token_id, t.text, t.logprob))
        else:
            top = [(t.token_id, t.text, t.logprob)
                   for t in (lp.top if top_n < 0 else lp.top[:top_n])]
        content.append({
            "token": style.name(lp.token_id, lp.text),
            "logprob": _clamped(lp.logprob),
            "bytes": list(lp.bytes),
            "top_logprobs": [{"token": (name := style.name(tid, text)),
                              "logprob": _clamped(v),
                              "bytes": list(name.encode("utf-8"))} for tid, text, v in top],
        })
    return {"content": content}


def completion_logprobs(items: Iterable[LogprobEntry], start_offset: int, num: int,
                        first_token: tuple[int, str] | None = None,
                        style: LogprobStyle = PLAIN) -> dict[str, Any]:
    """The legacy completions layout. Each position's top_logprobs holds the sampled token
    and the `num` most likely ones (so num + 1 entries at most, one for logprobs=0; every
    listed id with logprob_token_ids), the sampled token first, as OpenAI's completions API
    and vLLM report them. ``first_token``: (id, text) of a leading token without a logprob
    (an echoed prompt's first)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = start_offset
    if first_token is not None:
        name = style.name(*first_token)
        tokens.append(name)
        token_lps.append(None)
        tops.append(None)
        offsets.append(offset)
        offset += len(name)
    for lp in items:
        name = style.name(lp.token_id, lp.text)
        tokens.append(name)
        token_lps.append(_clamped(lp.logprob))
        ranked = [(name, lp.logprob)]
        ranked += [(style.name(t.token_id, t.text), t.logprob) for t in lp.top
                   if t.token_id != lp.token_id]
        if num >= 0 and not style.listed:
            ranked = ranked[: num + 1]
        tops.append({text: _clamped(v) for text, v in ranked})
        offsets.append(offset)
        offset += len(name)
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


def echo_prompt_logprobs(first_token: tuple[int, str], prompt_items: PromptLogprobs,
                         num: int, style: LogprobStyle = PLAIN) -> dict[str, Any]:
    """echo with logprobs, the prompt's part (shared by the prompt's n choices): its tokens,
    the first without a logprob, text offsets counted from the start of the prompt. The
    prompt's entries are its top ones (listed ids are the output's)."""
    prompt_style = LogprobStyle(as_token_ids=style.as_token_ids)
    head = completion_logprobs([], 0, num, first_token=first_token, style=prompt_style)
    rest = [lp for lp in prompt_items[1:] if lp is not None]
    tail = completion_logprobs(rest, len(head["tokens"][0]), num, style=prompt_style)
    return {k: head[k] + tail[k] for k in head}


def echo_logprobs(prompt_part: dict[str, Any], items: Iterable[LogprobEntry],
                  num: int, style: LogprobStyle = PLAIN) -> dict[str, Any]:
    """echo with logprobs: the prompt's part, then the generated tokens, whose text offsets
    go on from the end of the echoed prompt."""
    end = prompt_part["text_offset"][-1] + len(prompt_part["tokens"][-1])
    generated = completion_logprobs(items, end, num, style=style)
    return {k: prompt_part[k] + generated[k] for k in prompt_part}


# -- the SSE body ---------------------------------------------------------------------------

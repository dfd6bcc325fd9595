"""The OpenAI response shapes: /v1/completions and /v1/chat/completions, streamed as chunks
or whole, with their usage and logprobs JSON, and the SSE body that carries the chunks.

A renderer is made per request. It keeps one state object per choice (completions: the
choice's text offset and whether its echoed prompt went out; chat: what a tool-call parser
has seen of the choice), and turns the generation service's deltas into chunks (`chunk`),
the end of a stream into its usage chunk (`final`) and a collected generation into the whole
response (`response`).

The shapes (with render_json.py's usage and logprobs JSON) are vLLM's, byte for byte: the
order of keys, which are null and which are left out, -inf written as -9999.0. Each choice
carries vLLM's token-id fields, null unless return_token_ids asks for them: completions'
`prompt_token_ids` and `token_ids` (streamed: the prompt's on the choice's first chunk, the
delta's on every chunk; an echoed stream's first chunk carries the prompt's ids either way,
as vLLM's does), chat's `token_ids` per choice and `prompt_token_ids` on the response (streamed:
on the role chunks). `weight_versions` (return_weight_versions) is each choice's runs of
output tokens per weight version, `{"version", "start", "end"}` (end exclusive), on the
choice's last chunk when streamed; null otherwise, as vLLM's. `routed_experts` (no MoE
routing is reported) is written null where vLLM writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from actors.runtime.messages import ChoiceTiming

from server.api.common.render_json import (
    PLAIN,
    LogprobStyle,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    echo_prompt_logprobs,
    metrics_json,
    prompt_logprobs_json,
    response_usage_json,
    usage_json,
)
from server.frontend.chat.tool_calls import ChatChoice
from server.frontend.logprobs import LogprobEntry
from server.frontend.service import ChoiceDelta, Collected, TextGeneration, Usage


class _StreamOptions:
    """What stream_options asks of every chunk."""

    def __init__(self, include_usage: bool, continuous_usage: bool) -> None:
        self.include_usage = include_usage
        # Every chunk carries the usage of the one choice it is about (its prompt, its
        # tokens so far), as vLLM reports it.
        self.continuous_usage = include_usage and continuous_usage


class _Renderer:
    """What both OpenAI renderers share: the usage chunks stream_options asks for, and the
    per-request metrics (`metrics`: --enable-per-request-metrics), which describe one
    choice of one prompt and are null otherwise, as vLLM's."""

    gen: TextGeneration
    fingerprint: str
    options: _StreamOptions
    metrics: bool = False
    return_weight_versions: bool = False

    def _spans(self, spans: Sequence[tuple[str, int, int]] | None) -> list[dict[str, Any]] | None:
        if not self.return_weight_versions or spans is None:
            return None
        return [{"version": v, "start": start, "end": end} for v, start, end in spans]

    def _base(self) -> dict[str, Any]:
        raise NotImplementedError

    def _usage(self, usage: Usage, index: int | None = None,
               whole: bool = False) -> dict[str, Any]:
        """Usage JSON; `index`: one choice's (continuous usage), else every choice's."""
        return response_usage_json(usage) if whole else usage_json(usage)

    def _with_choice_usage(self, chunk: dict[str, Any], d: ChoiceDelta) -> dict[str, Any]:
        if self.options.continuous_usage:
            chunk["usage"] = self._usage(self.gen.choice_usage(d.index, d.generated_tokens),
                                         d.index)
        return chunk

    def final(self, usage: Usage, timing: ChoiceTiming | None = None
              ) -> dict[str, Any] | None:
        """The closing usage chunk (stream_options.include_usage), else nothing; it carries
        the metrics (vLLM sends them nowhere else in a stream)."""
        if not self.options.include_usage:
            return None
        chunk = dict(self._base(), choices=[], usage=self._usage(usage),
                     system_fingerprint=self.fingerprint)
        if self.metrics and self.gen.num_choices == 1:
            chunk["metrics"] = metrics_json(timing, usage.completion_tokens, stream=True)
        return chunk

    def _with_metrics(self, body: dict[str, Any], result: Collected) -> dict[str, Any]:
        if self.metrics:
            one = result.choices[0] if len(result.choices) == 1 else None
            body["metrics"] = None if one is None else metrics_json(one.timing, one.num_tokens)
        return body


# -- /v1/completions ------------------------------------------------------------------------
class CompletionChoice:
    """One choice of a completions stream: its text offset (logprobs count offsets from
    the start of the choice's text), whether its echoed prompt is still to go out and
    whether its prompt's ids are."""

    __slots__ = ("echo_pending", "offset", "prompt_ids_pending")

    def __init__(self, echo: bool, prompt_ids: bool) -> None:
        self.offset = 0
        self.echo_pending = echo
        self.prompt_ids_pending = prompt_ids


class CompletionRenderer(_Renderer):
    """The shapes of one /v1/completions response."""

    def __init__(self, gen: TextGeneration, *, model: str, fingerprint: str, echo: bool,
                 echo_only: bool, logprobs: int | None, include_usage: bool = False,
                 continuous_usage: bool = False, metrics: bool = False,
                 return_token_ids: bool = False, style: LogprobStyle = PLAIN,
                 return_weight_versions: bool = False) -> None:
        self.gen = gen
        self.metrics = metrics
        self.return_weight_versions = return_weight_versions
        self.model = model
        self.fingerprint = fingerprint
        self.response_id = f"cmpl-{gen.request_id}"
        self.echo = echo
        self.echo_only = echo_only  # echo with max_tokens=0: the generated token is dropped
        self.logprobs = logprobs
        self.num_logprobs = -1 if logprobs is None else logprobs
        self.options = _StreamOptions(include_usage, continuous_usage)
        self.return_token_ids = return_token_ids
        self.style = style
        self.choices = [CompletionChoice(echo, echo or return_token_ids)
                        for _ in range(gen.num_choices)]

    def _echoed(self, prompt_text: str) -> str:
        # As vLLM: with return_token_ids the echoed prompt is in prompt_token_ids, not text.
        return "" if self.return_token_ids else prompt_text

    def _base(self) -> dict[str, Any]:
        return {"id": self.response_id, "object": "text_completion", "created": self.gen.created,
                "model": self.model}

    def first_chunks(self) -> list[dict[str, Any]]:
        return []

    def chunk(self, d: ChoiceDelta) -> dict[str, Any] | None:
        state = self.choices[d.index]
        text = "" if self.echo_only else d.text
        if state.echo_pending:
            # The echoed prompt goes out in front of the choice's first chunk, as vLLM sends it.
            state.echo_pending = False
            text = self._echoed(self.gen.prompt_of(d.index).text) + text
        elif not text and not d.token_ids and d.finish_reason is None:
            return None  # nothing happened; a token with held-back text still goes out
        prompt_ids = None
        if state.prompt_ids_pending:
            state.prompt_ids_pending = False
            prompt_ids = self.gen.prompt_of(d.index).shown_ids
        lp = None
        if self.logprobs is not None:
            lp = completion_logprobs(d.logprobs, state.offset, self.num_logprobs,
                                     style=self.style)
            state.offset += sum(len(t) for t in lp["tokens"])
        chunk = dict(self._base(), choices=[{
            "index": d.index, "text": text, "logprobs": lp, "finish_reason": d.finish_reason,
            "stop_reason": d.stop_reason, "prompt_token_ids": prompt_ids,
            "token_ids": list(d.token_ids) if self.return_token_ids else None,
            "weight_versions": self._spans(d.weight_versions)}])
        if d.finish_reason is not None and not self.options.include_usage:
            chunk["system_fingerprint"] = self.fingerprint
        return self._with_choice_usage(chunk, d)

    def response(self, result: Collected) -> dict[str, Any]:
        gen, n, num = self.gen, self.gen.n, self.num_logprobs
        echo_lps = self.echo and self.logprobs is not None
        choices = []
        # Per prompt, shared by its n choices: prompt_logprobs and the echoed part.
        prompt_json: dict[int, Any] = {}
        echo_part: dict[int, dict[str, Any]] = {}
        for r in result.choices:
            p = r.index // n
            text = "" if self.echo_only else r.text
            if self.echo:
                text = self._echoed(gen.prompts[p].text) + text
            prompt_items = result.prompt_logprobs[p]
            if p not in prompt_json:
                prompt_json[p] = prompt_logprobs_json(prompt_items)
            lp = None
            if echo_lps:
                if prompt_items is None:
                    raise RuntimeError("the engine returned no prompt logprobs")
                if p not in echo_part:
                    prompt = gen.prompts[p]
                    first = (prompt.token_ids[0], prompt.first_token_text)
                    echo_part[p] = echo_prompt_logprobs(first, prompt_items, num, self.style)
                lp = echo_logprobs(echo_part[p], [] if self.echo_only else r.logprobs, num,
                                   self.style)
            elif self.logprobs is not None:
                lp = completion_logprobs(r.logprobs, 0, num, style=self.style)
            ids = self.return_token_ids
            choices.append({"index": r.index, "text": text, "logprobs": lp,
                            "finish_reason": r.finish_reason, "stop_reason": r.stop_reason,
                            "token_ids": list(r.token_ids) if ids else None,
                            "prompt_logprobs": prompt_json.get(p),
                            "prompt_token_ids": gen.prompts[p].shown_ids if ids else None,
                            "routed_experts": None,
                            "weight_versions": self._spans(r.weight_versions)})
        return self._with_metrics({
            "id": self.response_id, "object": "text_completion", "created": gen.created,
            "model": self.model, "choices": choices, "service_tier": None,
            "system_fingerprint": self.fingerprint, "usage": response_usage_json(result.usage),
        }, result)


# -- /v1/chat/completions -------------------------------------------------------------------
class ChatCompletionRenderer(_Renderer):
    """The shapes of one /v1/chat/completions response."""

    def __init__(self, gen: TextGeneration, *, model: str, fingerprint: str, role: str,
                 echoed: str, logprobs: bool, top_logprobs: int, include_usage: bool = False,
                 continuous_usage: bool = False,
                 new_choice: Callable[[], ChatChoice] = ChatChoice,
                 per_prompt: Sequence[tuple[str, str]] | None = None,
                 reasoning_usage: bool = False, metrics: bool = False,
                 return_token_ids: bool = False, style: LogprobStyle = PLAIN,
                 return_weight_versions: bool = False, reasoning_hidden: bool = False) -> None:
        self.gen = gen
        self.metrics = metrics
        self.return_weight_versions = return_weight_versions
        # `include_reasoning: false` under a reasoning parser: a whole response carries no
        # logprobs and no token ids (they would hold the reasoning left out), as vLLM's
        self.reasoning_hidden = reasoning_hidden
        self.model = model
        self.fingerprint = fingerprint
        self.response_id = f"chatcmpl-{gen.request_id}"
        self.role = role
        self.echoed = echoed  # the last message's text, in front of each choice's
        # (role, echoed) of each prompt, where prompts are conversations of their own (batch)
        self.per_prompt = per_prompt
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.options = _StreamOptions(include_usage, continuous_usage)
        self.choices = [new_choice() for _ in range(gen.num_choices)]
        # With a reasoning parser, usage carries completion_tokens_details.reasoning_tokens
        # (vLLM's; without one the usage is left as it was, with no details).
        self.reasoning_usage = reasoning_usage
        self.return_token_ids = return_token_ids
        self.style = style

    def _usage(self, usage: Usage, index: int | None = None,
               whole: bool = False) -> dict[str, Any]:
        out = super()._usage(usage, index, whole)
        if self.reasoning_usage:
            choices = self.choices if index is None else [self.choices[index]]
            out["completion_tokens_details"] = {
                "reasoning_tokens": sum(c.reasoning_tokens for c in choices)}
        return out

    def _base(self) -> dict[str, Any]:
        return {"id": self.response_id, "object": "chat.completion.chunk",
                "created": self.gen.created, "model": self.model}

    def _opening(self, index: int, delta: dict[str, Any]) -> dict[str, Any]:
        chunk = dict(self._base(), choices=[{"index": index, "delta": delta, "logprobs": None,
                                             "finish_reason": None}])
        if self.options.continuous_usage:
            chunk["usage"] = self._usage(self.gen.choice_usage(index, 0), index)
        return chunk

    def first_chunks(self) -> list[dict[str, Any]]:
        # One role chunk per choice, then (echo) one chunk per choice with the echoed text.
        # The role chunks carry the prompt's ids (null unless return_token_ids), as vLLM's.
        indexes = range(self.gen.num_choices)
        chunks = [dict(self._opening(i, {"role": self.role, "content": ""}),
                       prompt_token_ids=self._prompt_ids(i), prompt_text=None)
                  for i in indexes]
        if self.echoed:
            chunks += [self._opening(i, {"content": self.echoed}) for i in indexes]
        return chunks

    def _logprobs_json(self, items: Sequence[LogprobEntry]) -> dict[str, Any] | None:
        return chat_logprobs(items, self.top_logprobs, self.style) if self.logprobs else None

    def _prompt_ids(self, index: int) -> list[int] | None:
        return self.gen.prompt_of(index).shown_ids if self.return_token_ids else None

    def chunk(self, d: ChoiceDelta) -> dict[str, Any] | None:
        if not d.text and not d.token_ids and d.finish_reason is None:
            return None
        state = self.choices[d.index]
        delta = state.delta(d)
        if delta is None:
            # Held back by a parser: only logprobs, token ids (or the finish) still need
            # the chunk.
            if d.finish_reason is None and not self.logprobs and not self.return_token_ids:
                return None
            delta = {}
        choice: dict[str, Any] = {"index": d.index, "delta": delta,
                                  "logprobs": self._logprobs_json(d.logprobs),
                                  "finish_reason": state.finish_reason(d.finish_reason)}
        chunk = dict(self._base(), choices=[choice])
        if d.finish_reason is not None:
            choice["stop_reason"] = d.stop_reason
        choice["token_ids"] = list(d.token_ids) if self.return_token_ids else None
        if d.finish_reason is not None:
            choice["weight_versions"] = self._spans(d.weight_versions)
            if not self.options.include_usage:
                chunk["system_fingerprint"] = self.fingerprint
        return self._with_choice_usage(chunk, d)

    def response(self, result: Collected) -> dict[str, Any]:
        choices = []
        for r in result.choices:
            role, echoed = (self.role, self.echoed) if self.per_prompt is None else \
                self.per_prompt[r.index // self.gen.n]
            message, reason = self.choices[r.index].whole(r, role, echoed)
            hidden = self.reasoning_hidden
            choices.append({"index": r.index, "message": message,
                            "logprobs": None if hidden else self._logprobs_json(r.logprobs),
                            "finish_reason": reason, "stop_reason": r.stop_reason,
                            "token_ids": list(r.token_ids)
                            if self.return_token_ids and not hidden else None,
                            "routed_experts": None,
                            "weight_versions": self._spans(r.weight_versions)})
        return self._with_metrics({
            "id": self.response_id, "object": "chat.completion", "created": self.gen.created,
            "model": self.model, "choices": choices, "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": self._usage(result.usage, whole=True),
            "prompt_logprobs": prompt_logprobs_json(
                result.prompt_logprobs[0] if result.prompt_logprobs else None),
            # a batch's prompts are its choices' own: none is the response's (vLLM's)
            "prompt_token_ids": None if self.per_prompt is not None else self._prompt_ids(0),
        }, result)

"""The API-neutral generation service: rendered prompts and SamplingParams in, typed deltas
per choice out.

Every API (OpenAI's completions and chat today, the Anthropic Messages and OpenAI Responses
APIs next) hands it the PromptInputs it rendered and the SamplingParams it built, and reads
back what each choice generated: text, token ids, logprobs with the tokens' decoded text,
why it finished, and the request's token counts. Nothing here knows any API's JSON or
HTTP: what goes wrong is a typed `ServiceFailure` (server.frontend.failures) that each
dialect maps to its envelope.

    gen = await start(ctx, request_id, prompts, params)     # ServiceFailure: Refused ...
    async for event in gen.stream(idle_after=15.0):         # ChoiceDelta | Idle | Failed | Finished
        ...
    result = await gen.collect()                             # Collected, or ServiceFailure

Both `stream` and `collect` retire the request when they end, however they end.

Logprobs become LogprobEntry objects only when read (the Logprobs sequences): a whole
response's logprobs (a million prompt positions, say) are built in the worker thread that
builds its body, never in one step of the event loop.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import trio
from actors.params.encoder import EncoderInput
from actors.params.sampling import SamplingParams
from actors.runtime.messages import ChoiceTiming
from actors.runtime.outbox import ChoiceUpdate, OutboxFailed, TokenLogprob
from actors.runtime.request import PromptInput
from actors.text.detokenizer import TokenTexts

from server.errors import APIError, failure_of_api_error
from server.frontend.context import FrontendContext
from server.frontend.failures import ServiceFailure, failure_of
from server.frontend.generation import Generation
from server.frontend.logprobs import Logprobs, PromptLogprobs
from server.frontend.structured import compile_spec

# (weight version, first output token, end) of each run of a choice's tokens one weight
# version sampled (vLLM's weight_versions; actors.core.weight_transfer)
WeightSpans = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt as the engine received it (after any template and truncation)."""

    text: str
    token_ids: list[int]
    first_token_text: str  # the first token decoded alone, as logprobs report tokens
    from_embeds: bool = False  # given as prompt_embeds: token_ids are placeholders

    @property
    def shown_ids(self) -> list[int] | None:
        """The ids a response shows for this prompt: none for embeddings (as vLLM)."""
        return None if self.from_embeds else list(self.token_ids)


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one choice generated since the last delta of that choice. A delta may carry
    token ids but no text (text held back, e.g. a possible stop string's prefix)."""

    index: int  # prompt index x n + choice within the prompt
    text: str
    token_ids: list[int]
    logprobs: Logprobs  # empty unless the request asked for logprobs
    finish_reason: str | None
    stop_reason: str | int | None
    generated_tokens: int  # this choice's tokens so far, this delta's included
    # The prompt's, on the first delta of each prompt's first choice when asked for.
    prompt_logprobs: PromptLogprobs | None = None
    # The choice's clock, on its last delta (per-request metrics on).
    timing: ChoiceTiming | None = None
    # On its last delta: (weight version, start, end) runs over its output tokens.
    weight_versions: WeightSpans | None = None


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing new for `idle_after` seconds (a stream may write a keep-alive)."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The request failed after it was admitted; nothing more follows."""

    failure: ServiceFailure

    @property
    def message(self) -> str:
        return self.failure.message


@dataclass(frozen=True, slots=True)
class Finished:
    """Every choice finished; the request's usage, and the clock of its one choice (None
    with several choices, or per-request metrics off)."""

    usage: Usage
    timing: ChoiceTiming | None = None


StreamEvent = ChoiceDelta | Idle | Failed | Finished
IDLE = Idle()


@dataclass(slots=True)
class ChoiceResult:
    """One choice, whole."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: Logprobs
    finish_reason: str | None
    stop_reason: str | int | None
    # (text, tokens) of each delta as it came, for readers that must see the text as a
    # stream would (a reasoning parser counts reasoning tokens per delta)
    pieces: list[tuple[str, int]] = field(default_factory=list)
    timing: ChoiceTiming | None = None  # per-request metrics on
    weight_versions: WeightSpans | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)
class Collected:
    """A whole generation: every choice, each prompt's logprobs (None where not asked for),
    the usage."""

    choices: list[ChoiceResult]
    prompt_logprobs: list[PromptLogprobs | None]
    usage: Usage


@dataclass(slots=True)
class _Accumulator:
    text: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each text piece's tokens
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    timing: ChoiceTiming | None = None
    weight_versions: WeightSpans | None = None


# -- the service ----------------------------------------------------------------------------
class TextGeneration:
    """One admitted generation, read as typed deltas (stream) or whole (collect)."""

    def __init__(self, gen: Generation, texts: TokenTexts) -> None:
        # texts: the tokenizer actor's TokenTexts, for each prompt's first token (the one
        # position no logprob carries: an echo with logprobs still shows its text).
        self._gen = gen
        state = gen.state
        self.request_id: str = gen.public_id
        self.created: int = gen.created
        self.num_choices: int = state.num_choices
        self.n: int = state.params.n  # choices per prompt
        self.prompts: tuple[Prompt, ...] = tuple(
            Prompt(p.text, p.token_ids, texts[p.token_ids[0]] if p.token_ids else "",
                   p.embeds is not None)
            for p in state.prompt_results)

    def prompt_of(self, index: int) -> Prompt:
        """The prompt choice `index` continues."""
        return self.prompts[index // self.n]

    def usage(self, completion_tokens: int) -> Usage:
        """The whole request's: every prompt, every choice."""
        return Usage(sum(len(p.token_ids) for p in self.prompts), completion_tokens)

    def choice_usage(self, index: int, completion_tokens: int) -> Usage:
        """One choice's: its own prompt and the tokens it generated."""
        return Usage(len(self.prompt_of(index).token_ids), completion_tokens)

    def retire(self) -> None:
        """Abort whatever still runs; idempotent, never waits."""
        self._gen.retire()

    def abort(self) -> None:
        """End every unfinished choice now with finish_reason "abort". Unlike retire, the
        reader still gets those ends: stream and collect finish as for any other reason."""
        actors = self._gen.srv.actors
        if actors is not None:
            actors.abort(self._gen.state)

    async def stream(self, idle_after: float | None = None) -> AsyncIterator[StreamEvent]:
        """Deltas as they come; Idle after `idle_after` seconds without news; then Finished
        or Failed. Retires the request when it ends (run it under contextlib.aclosing, so
        that a consumer that stops early ends it at once)."""
        generated = [0] * self.num_choices
        timing = None
        outbox = self._gen.state.outbox
        wait = math.inf if idle_after is None else idle_after
        try:
            while not outbox.done:
                try:
                    with trio.move_on_after(wait) as waiting:
                        updates = await outbox.get()  # cancel-safe: nothing is lost
                except OutboxFailed as exc:
                    yield Failed(failure_of(exc.error))
                    return
                if waiting.cancelled_caught:
                    yield IDLE
                    continue
                for u in updates:
                    generated[u.index] += len(u.token_ids)
                    timing = timing or u.timing
                    yield self._delta(u, generated[u.index])
            yield Finished(self.usage(sum(generated)),
                           timing if self.num_choices == 1 else None)
        finally:
            self.retire()

    async def collect(self) -> Collected:
        """Everything, once every choice has finished. A failure after admission is a
        ServiceFailure. Retires the request."""
        acc = [_Accumulator() for _ in range(self.num_choices)]
        prompt_lps: list[PromptLogprobs | None] = [None] * len(self.prompts)
        outbox = self._gen.state.outbox
        try:
            while not outbox.done:
                try:
                    updates = await outbox.get()
                except OutboxFailed as exc:
                    raise failure_of(exc.error) from None
                for u in updates:
                    a = acc[u.index]
                    a.text.append(u.text)
                    a.sizes.append(len(u.token_ids))
                    a.token_ids.extend(u.token_ids)
                    a.logprobs.extend(u.logprobs)
                    if u.prompt_logprobs is not None and u.index % self.n == 0:
                        prompt_lps[u.index // self.n] = PromptLogprobs(u.prompt_logprobs)
                    if u.finish_reason is not None:
                        a.finish_reason, a.stop_reason = u.finish_reason, u.stop_reason
                        a.timing = u.timing
                        a.weight_versions = u.weight_versions
        finally:
            self.retire()
        choices = [ChoiceResult(i, "".join(a.text), a.token_ids, Logprobs(a.logprobs),
                                a.finish_reason, a.stop_reason, list(zip(a.text, a.sizes)),
                                a.timing, a.weight_versions)
                   for i, a in enumerate(acc)]
        return Collected(choices, prompt_lps, self.usage(sum(c.num_tokens for c in choices)))

    def _delta(self, u: ChoiceUpdate, generated: int) -> ChoiceDelta:
        prompt_lps = None
        if u.prompt_logprobs is not None:
            prompt_lps = PromptLogprobs(u.prompt_logprobs)
        return ChoiceDelta(u.index, u.text, u.token_ids, Logprobs(u.logprobs),
                           u.finish_reason, u.stop_reason, generated, prompt_lps, u.timing,
                           u.weight_versions)


async def start(ctx: FrontendContext, request_id: str, prompts: list[PromptInput],
                params: SamplingParams,
                encoder_input: EncoderInput | None = None) -> TextGeneration:
    """Admit the request and wait until its prompts are tokenized. Raises ServiceFailure
    (Unavailable when the server is full or not serving, Refused for a prompt the engine
    cannot take).
    ``encoder_input``: an encoder-decoder model's (Whisper: one prompt, the decoder's
    tokens; see server.frontend.transcription)."""
    unpin = None
    if params.structured is not None:
        # compiled by the engine side before admission (a 400 for a spec the backend
        # refuses, a 503 when the compile queue is full); pinned until the request retires
        unpin = await compile_spec(ctx, params.structured)
    try:
        gen = ctx.start(request_id, prompts, params, encoder_input=encoder_input)
        await gen.start()
    except BaseException as exc:
        if unpin is not None:
            unpin()  # the engine compiles for itself (off its threads) if it must
        if isinstance(exc, APIError):  # the admission still answers in HTTP's terms
            raise failure_of_api_error(exc) from None
        raise
    if unpin is not None:
        _release_when_retired(ctx.reaper, gen, unpin)
    try:
        return TextGeneration(gen, ctx.token_texts)
    except BaseException:
        gen.retire()
        raise


def _release_when_retired(reaper: trio.Nursery | None, gen: Generation,
                          unpin: Callable[[], None]) -> None:
    """Unpins the request's grammar once every sequence of it has left the engine."""
    state = gen.state
    if reaper is None or state.retired.is_set():
        unpin()
        return

    async def release() -> None:
        try:
            await state.retired.wait()
        finally:
            unpin()

    reaper.start_soon(release)

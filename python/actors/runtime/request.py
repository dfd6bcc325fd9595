"""Per-request state, owned by the tokenizer actor (all actors run in one Trio thread).

One HTTP request becomes one engine request per prompt, each with the request's n choices
(the engine runs the prompt once and forks the other choices from it):

    RequestState "abc" (n=2, two prompts)
      engine requests: abc-0 (prompt 0): choices 0, 1  -> outbox indices 0, 1
                       abc-1 (prompt 1): choices 0, 1  -> outbox indices 2, 3

A choice is *retired* once no actor will touch it again: the engine actor said so (a
Retired message: it finished or was aborted in the engine), or it never reached the engine.
The HTTP edge builds a RequestState and registers it; from then on only the tokenizer actor
writes it (actors.runtime.messages: the engine actor sends messages, never writes here). The HTTP edge returns the request's admission slots
(one per choice) only after every choice has retired, which is what bounds every internal
channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from actors.errors import DuplicateRequest
from actors.messages import Admit
from actors.params.embeds import PromptEmbeds
from actors.params.encoder import EncoderInput
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams
from actors.runtime.failures import Outcome, ServerFailed
from actors.runtime.outbox import ChoiceUpdate, Outbox
from actors.text.detokenizer import IncrementalDetokenizer


@dataclass(slots=True)
class PromptInput:
    """One prompt: text, token ids, a deferred render (a chat template) producing text, or
    embedding rows (decoded and bounded by the front end)."""

    text: str | None = None
    token_ids: list[int] | None = None
    render: Callable[[], str] | None = None
    add_special_tokens: bool = True
    embeds: PromptEmbeds | None = None


@dataclass(slots=True)
class PromptResult:
    """A prompt after tokenization. An embeddings prompt has one placeholder id per row
    (actors.params.embeds), its rows as the engine runs them (truncated), no text."""

    token_ids: list[int]
    text: str
    embeds: PromptEmbeds | None = None


@dataclass(slots=True, eq=False)
class Choice:
    """One choice of one prompt: its detokenizer and retirement (its timing is the engine
    actor's: actors.runtime.accounting), and under a stream_interval the output it holds
    back."""

    index: int  # within its prompt: the engine's RequestOutput.index
    outbox_index: int  # prompt index x n + index: the index the client sees
    detokenizer: IncrementalDetokenizer | None = None
    abort_requested: bool = False  # an AbortChoices for it went to the engine
    retired: bool = False  # a Retired came back (or it never reached the engine)
    finish_reason: str | None = None  # as the engine's Retired reported it
    # Sent to the engine and no output of it seen yet: its prompt counts in the tokenizer
    # actor's prefill backlog (--max-num-queued-tokens).
    prefilling: bool = False
    held: ChoiceUpdate | None = None  # stream_interval: output not pushed yet
    pushed: bool = False  # stream_interval: its first output went out
    # (weight version, index of its first output token) of each run of tokens one version
    # sampled, and the tokens so far (vLLM's weight_versions spans)
    version_starts: list[tuple[str, int]] = field(default_factory=list)
    num_tokens: int = 0

    def track_version(self, version: str, new_tokens: int) -> None:
        """`new_tokens` more output tokens, sampled by weights labelled `version`."""
        if new_tokens and (not self.version_starts or self.version_starts[-1][0] != version):
            self.version_starts.append((version, self.num_tokens))
        self.num_tokens += new_tokens

    def version_spans(self) -> tuple[tuple[str, int, int], ...]:
        """(version, start, end) over the output tokens, end exclusive."""
        starts = self.version_starts
        ends = [start for _, start in starts[1:]] + [self.num_tokens]
        return tuple((v, s, e) for (v, s), e in zip(starts, ends))

    def gather(self, update: ChoiceUpdate, interval: int) -> ChoiceUpdate | None:
        """vLLM's stream_interval: the update to push now (what was held merged in front of
        it), or None while fewer than `interval` tokens wait. The first output and the
        finish go out at once."""
        if self.held is not None:
            self.held.merge(update)
            update, self.held = self.held, None
        if update.finish_reason is None and self.pushed and len(update.token_ids) < interval:
            self.held = update
            return None
        self.pushed = True
        return update

    def ending(self, reason: str) -> ChoiceUpdate:
        """The update that ends the choice with `reason`, after what it still holds."""
        end = ChoiceUpdate(self.outbox_index, finish_reason=reason,
                           weight_versions=self.version_spans())
        if self.held is None:
            return end
        held, self.held = self.held, None
        held.merge(end)
        return held


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One prompt of a request as the engine knows it: the frozen Admit that went to the
    engine (one prompt, params.n choices), and the tokenizer actor's books on its choices."""

    admit: Admit
    prompt_index: int
    choices: list[Choice] = field(default_factory=list)
    abort_requested: bool = False  # every choice
    done: bool = False  # every choice retired

    @property
    def engine_id(self) -> str:
        return self.admit.request_id


class RequestState:
    """Everything the actors know about one HTTP request."""

    def __init__(
        self,
        request_id: str,
        prompts: list[PromptInput],
        params: SamplingParams,
        *,
        max_model_len: int,
        outbox: Outbox | None = None,
        pooling: PoolingSpec | None = None,
        encoder_input: EncoderInput | None = None,
    ) -> None:
        """`outbox`: the front end's own (a subclass), else a plain one for n x prompts."""
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.max_model_len = max_model_len
        self.pooling = pooling
        self.encoder_input = encoder_input  # one prompt: the decoder's, for this window
        self.arrival = time.monotonic()
        self.outbox = Outbox(len(prompts) * params.n) if outbox is None else outbox
        self.engine_requests: list[EngineRequest] = []
        self.prompt_results: list[PromptResult] = []
        self.ready = trio.Event()  # set once prompts are tokenized (or failed)
        self.error: Outcome | None = None  # why it ended before its first output
        self.cancelled = False
        self.retired = trio.Event()

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    def fail_before_start(self, error: Outcome) -> None:
        self.error = error
        for req in self.engine_requests:
            req.done = True
            for choice in req.choices:
                choice.retired = True
        self.retired.set()
        self.ready.set()

    def note_retired(self) -> None:
        if all(req.done for req in self.engine_requests):
            self.retired.set()


class Registry:
    """Live requests by id and their engine requests by engine id."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestState] = {}
        self.engine_requests: dict[str, tuple[RequestState, EngineRequest]] = {}
        self._empty = trio.Event()  # set while no request is registered
        self._empty.set()

    def add(self, state: RequestState) -> None:
        if state.request_id in self.requests:
            raise DuplicateRequest(f"request id {state.request_id!r} is already in flight")
        self.requests[state.request_id] = state
        if self._empty.is_set():
            self._empty = trio.Event()

    def add_engine_requests(self, state: RequestState) -> None:
        for req in state.engine_requests:
            self.engine_requests[req.engine_id] = (state, req)

    def remove(self, state: RequestState) -> None:
        self.requests.pop(state.request_id, None)
        for req in state.engine_requests:
            self.engine_requests.pop(req.engine_id, None)
        if not self.requests:
            self._empty.set()

    async def wait_empty(self) -> None:
        """Returns once no request is registered (at once if none is): the drain waits for
        this, not for a poll of len()."""
        while self.requests:
            await self._empty.wait()

    def fail_all(self, error: ServerFailed) -> None:
        """The server itself failed: every live request fails (its handler's error, or an
        error event on a stream that already started) and retires at once."""
        for state in list(self.requests.values()):
            if not state.ready.is_set():
                state.fail_before_start(error)
                continue
            state.outbox.fail(error)
            for req in state.engine_requests:
                req.done = True
                for choice in req.choices:
                    choice.retired = True
            state.retired.set()

    def __len__(self) -> int:
        return len(self.requests)

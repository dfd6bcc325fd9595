"""Per-request state shared by the actors (all of them run in one Trio thread).

One HTTP request fans out into children, one engine sequence each:

    RequestState "abc" (n=2, two prompts)
      children: abc-0 (prompt 0, choice 0)   abc-1 (prompt 0, choice 1)
                abc-2 (prompt 1, choice 2)   abc-3 (prompt 1, choice 3)

A child is *retired* once no actor will touch it again: it finished or was aborted in the
engine, or it never reached the engine. The HTTP edge returns the request's admission slots
only after every child has retired, which is what bounds every internal channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from actors.text.detokenizer import IncrementalDetokenizer
from actors.runtime.outbox import Outbox
from actors.params.sampling import SamplingParams


@dataclass(slots=True)
class PromptInput:
    """One prompt: text, token ids, or a deferred render (a chat template) producing text."""

    text: str | None = None
    token_ids: list[int] | None = None
    render: Callable[[], str] | None = None
    add_special_tokens: bool = True


@dataclass(slots=True)
class PromptResult:
    """A prompt after tokenization."""

    token_ids: list[int]
    text: str


@dataclass(slots=True, eq=False)
class Child:
    engine_id: str
    index: int
    prompt_index: int
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=list)
    detokenizer: IncrementalDetokenizer | None = None
    abort_requested: bool = False
    in_engine: bool = False
    retired: bool = False
    finish_reason: str | None = None
    num_generated: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # timing, in time.monotonic() seconds
    admitted_at: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    inter_token: list[float] = field(default_factory=list)


class RequestError(Exception):
    """A request-scoped failure with its HTTP status (raised before any output)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class RequestState:
    """Everything the actors know about one HTTP request."""

    def __init__(
        self,
        request_id: str,
        prompts: list[PromptInput],
        params: SamplingParams,
        *,
        max_model_len: int,
    ) -> None:
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.max_model_len = max_model_len
        self.arrival = time.monotonic()
        self.outbox = Outbox(len(prompts) * params.n)
        self.children: list[Child] = []
        self.prompt_results: list[PromptResult] = []
        self.ready = trio.Event()  # set once prompts are tokenized (or failed)
        self.error: RequestError | None = None
        self.cancelled = False
        self.retired = trio.Event()

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    def fail_before_start(self, error: RequestError) -> None:
        self.error = error
        for child in self.children:
            child.retired = True
        self.retired.set()
        self.ready.set()

    def note_retired(self) -> None:
        if all(c.retired for c in self.children):
            self.retired.set()


class Registry:
    """Live requests by id and their children by engine id."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestState] = {}
        self.children: dict[str, tuple[RequestState, Child]] = {}

    def add(self, state: RequestState) -> None:
        if state.request_id in self.requests:
            raise RequestError(400, f"request id {state.request_id!r} is already in flight")
        self.requests[state.request_id] = state

    def add_children(self, state: RequestState) -> None:
        for child in state.children:
            self.children[child.engine_id] = (state, child)

    def remove(self, state: RequestState) -> None:
        self.requests.pop(state.request_id, None)
        for child in state.children:
            self.children.pop(child.engine_id, None)

    def fail_all(self, message: str) -> None:
        """The server itself failed: every live request gets a 500 (its handler's envelope,
        or an error event on a stream that already started) and retires at once."""
        for state in list(self.requests.values()):
            if not state.ready.is_set():
                state.fail_before_start(RequestError(500, message))
                continue
            state.outbox.fail(500, message)
            for child in state.children:
                child.retired = True
            state.retired.set()

    def __len__(self) -> int:
        return len(self.requests)

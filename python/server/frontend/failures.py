"""Why the generation service could not serve a request, as types and without HTTP.

`service.start` and `TextGeneration.collect` raise a `ServiceFailure`, and a stream's
`Failed` event carries one; each dialect maps it to its own envelope (the OpenAI error
object, Anthropic's `{"type": "error", ...}`, a Responses `failed` body, an audio stream's
error event). The HTTP status of each kind is the HTTP layer's (server/errors.py), one table
for every dialect:

- `Refused`: the request's own fault (a prompt longer than the context, more sequences
  than the server runs at once, an output constraint the backend refuses). `param` names
  the field at fault where one is.
- `Unavailable`: the server cannot take the request now (not serving, generation paused,
  at capacity, the grammar compile queue full); `retry_after` is the advice, if any.
- `ClientLeft`: the client went away before anything ran for it.
- `Broken`: the server's own failure (the engine or an actor failed).

Messages are written for the client; library text never reaches them.
"""

from __future__ import annotations

from actors.errors import RequestRefused
from actors.runtime.failures import ClientGone, GenerationPaused, Outcome

__all__ = ["AT_CAPACITY", "NOT_SERVING", "Broken", "ClientLeft", "Refused", "ServiceFailure",
           "Unavailable", "failure_of"]

AT_CAPACITY = "The server is at capacity; retry shortly."
NOT_SERVING = "The server is not accepting requests now."


class ServiceFailure(Exception):
    def __init__(self, message: str, param: str | None = None, *,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after


class Refused(ServiceFailure):
    """The request's own fault: sending it again unchanged fails again."""


class Unavailable(ServiceFailure):
    """Not now: the same request may succeed later (after `retry_after` seconds)."""


class ClientLeft(ServiceFailure):
    """The client went away before its prompt was prepared."""


class Broken(ServiceFailure):
    """The server failed while serving the request."""


def failure_of(reason: Outcome, param: str | None = None) -> ServiceFailure:
    """The failure a typed reason from the runtime amounts to (`param`: the field to name,
    for a refusal)."""
    if isinstance(reason, RequestRefused):
        return Refused(reason.message, param)
    if isinstance(reason, ClientGone):
        return ClientLeft(reason.message)
    if isinstance(reason, GenerationPaused):
        return Unavailable(reason.message)
    return Broken(reason.message)

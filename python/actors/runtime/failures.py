"""Why an admitted request could not finish, as types: the runtime's half of the error model.

``actors.errors`` holds refusals (``RequestRefused``: the request's own fault, found before
any output). These are the other kind: the request was fine, something else went wrong.
They carry a message written for the client (never library text) and no HTTP status; a
front end maps each type to what its protocol says (python -m server: server/errors.py).
"""

from __future__ import annotations

from actors.errors import RequestRefused

__all__ = ["ClientGone", "EngineFailed", "GenerationPaused", "PrepareFailed", "RequestFailed",
           "RowRefused", "ServerFailed", "Outcome"]


class RequestFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ClientGone(RequestFailed):
    """The client went away before its prompt was prepared: nothing was run for it."""

    def __init__(self, message: str = "client disconnected") -> None:
        super().__init__(message)


class PrepareFailed(RequestFailed):
    """Rendering or tokenizing the prompt failed for a reason that is not the request's."""

    def __init__(self, message: str = "internal error while preparing the prompt") -> None:
        super().__init__(message)


class RowRefused(RequestFailed):
    """This request's row was refused at run time: the sampler refused its values (a value
    validation should have stopped), or its output constraint's matcher failed; only this
    request ends."""

    def __init__(self, message: str = "internal error: this request's sampling parameters "
                                      "or output constraint failed at run time; other "
                                      "requests are unaffected") -> None:
        super().__init__(message)


class EngineFailed(RequestFailed):
    """An engine step raised: every request in flight is lost."""

    def __init__(self, message: str = "the engine failed while serving this request") -> None:
        super().__init__(message)


class GenerationPaused(RequestFailed):
    """The operator paused generation (/pause in abort or wait mode): retry after resume."""

    def __init__(self, message: str = "Generation is paused. Please retry after it "
                                      "resumes.") -> None:
        super().__init__(message)


class ServerFailed(RequestFailed):
    """An actor raised: every request in flight is lost."""

    def __init__(self, message: str = "the server failed while serving this request") -> None:
        super().__init__(message)


# What ends a request early: a refusal (its fault) or a failure (not its fault).
Outcome = RequestRefused | RequestFailed

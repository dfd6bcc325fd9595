"""Typed refusals out of the engine side. They carry no HTTP status: the server maps them
(``RequestRefused`` -> 400 naming ``param``, ``ServerBusy`` -> 503, ...)."""

from __future__ import annotations

__all__ = ["DuplicateRequest", "PromptTooLong", "RequestRefused", "TokenOutOfVocab"]


class RequestRefused(ValueError):
    """A request that cannot run as asked, refused before any output. ``param`` names the
    request field at fault (OpenAI's ``error.param``) when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self):
        # Rebuilt from (message, param), which every subclass takes, so a refusal keeps its
        # type and param across a process boundary (actors.core.process).
        return type(self), (self.message, self.param), self.__dict__


class PromptTooLong(RequestRefused):
    """The prompt leaves no room for the completion within max_model_len."""


class TokenOutOfVocab(RequestRefused):
    """A token id (prompt, logit_bias, allowed_token_ids, ...) outside the vocabulary."""


class DuplicateRequest(RequestRefused):
    """A request id already in flight."""

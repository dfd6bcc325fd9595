"""API errors and the one envelope every failure is returned in.

    {"error": {"message": str, "type": str, "param": str | null, "code": int}}

Messages are written by us; exception text from libraries is never echoed to a client.
The engine side reports why a request ended as types (actors.errors refusals,
actors.runtime.failures), and the generation service as its failures
(server.frontend.failures); `status_of`, `api_error_of` and `status_of_failure` are the
one place that turns them into HTTP statuses, for every dialect's envelope.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson

from actors.errors import RequestRefused
from actors.runtime.failures import ClientGone, GenerationPaused, RequestFailed

from server.frontend.failures import (
    AT_CAPACITY, Broken, ClientLeft, Refused, ServiceFailure, Unavailable,
)

# OpenAI-style error types by status.
_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "RequestTooLarge",
    415: "UnsupportedMediaType",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class LoadRefused(RuntimeError):
    """A load-time refusal that is not the loader's own (a --lora-modules adapter): the
    server exits 2 with its message (server.supervisor)."""


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return envelope(self.status, self.message, self.param)


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    try:
        return HTTPStatus(status).phrase.replace(" ", "")
    except ValueError:
        return "Error"


def envelope(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


def envelope_bytes(status: int, message: str, param: str | None = None) -> bytes:
    return orjson.dumps(envelope(status, message, param))


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def overloaded(retry_after: int = 1) -> APIError:
    return APIError(
        503,
        AT_CAPACITY,
        headers={"Retry-After": str(retry_after)},
    )


def prefill_backlog_full(retry_after: int = 1) -> APIError:
    """--max-num-queued-tokens reached (vLLM's MaxQueuedTokensError, its message)."""
    return APIError(503, "The engine has reached its prefill token backlog limit. Please try "
                    "again later or on a different instance.",
                    headers={"Retry-After": str(retry_after)})


# 499: nginx's "client closed request"; nobody reads the answer, but logs and metrics do.
CLIENT_GONE = 499


def status_of(error: BaseException) -> int:
    """The HTTP status of a typed reason a request ended: a refusal is the request's fault
    (400), a client that left is 499, a paused engine 503 (retry later, as vLLM), anything
    else is the server's (500)."""
    if isinstance(error, RequestRefused):
        return 400
    if isinstance(error, ClientGone):
        return CLIENT_GONE
    if isinstance(error, GenerationPaused):
        return 503
    return 500


def api_error_of(error: BaseException) -> APIError:
    """The APIError for a typed reason; only our own messages reach the client."""
    if isinstance(error, RequestRefused):
        return APIError(400, error.message, param=error.param)
    if isinstance(error, RequestFailed):
        return APIError(status_of(error), error.message)
    return APIError(500, "internal error")


def status_of_failure(failure: ServiceFailure) -> int:
    """The HTTP status of a generation service failure, whichever dialect's envelope it is
    written in."""
    if isinstance(failure, Refused):
        return 400
    if isinstance(failure, Unavailable):
        return 503
    if isinstance(failure, ClientLeft):
        return CLIENT_GONE
    return 500


def api_error_of_failure(failure: ServiceFailure) -> APIError:
    """A service failure as the APIError the app writes in the route's envelope."""
    headers = None if failure.retry_after is None else {"Retry-After": str(failure.retry_after)}
    return APIError(status_of_failure(failure), failure.message, param=failure.param,
                    headers=headers)


def failure_of_api_error(exc: APIError) -> ServiceFailure:
    """The failure an admission refusal written as an APIError amounts to (the inverse of
    `api_error_of_failure`: the same status, message, field and Retry-After)."""
    retry = exc.headers.get("Retry-After")
    kind: type[ServiceFailure] = {400: Refused, 503: Unavailable,
                                  CLIENT_GONE: ClientLeft}.get(exc.status, Broken)
    return kind(exc.message, exc.param, retry_after=None if retry is None else int(retry))

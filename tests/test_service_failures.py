"""The generation service's typed failures and the one HTTP status table every dialect
writes them with: the runtime's reasons map to the failure kinds, and an admission refusal
written as an APIError survives the trip to a failure and back unchanged (status, message,
field, Retry-After), which is what keeps every envelope on the wire as it was."""

from __future__ import annotations

import pytest

from actors.errors import RequestRefused
from actors.runtime.failures import ClientGone, EngineFailed, GenerationPaused
from server.errors import (
    APIError, api_error_of, api_error_of_failure, failure_of_api_error, overloaded,
    status_of, status_of_failure,
)
from server.frontend.failures import (
    AT_CAPACITY, Broken, ClientLeft, Refused, Unavailable, failure_of,
)


@pytest.mark.parametrize("reason, kind", [
    (RequestRefused("prompt is too long", "prompt"), Refused),
    (ClientGone(), ClientLeft),
    (GenerationPaused(), Unavailable),
    (EngineFailed(), Broken),
])
def test_runtime_reasons_map_to_kinds_with_the_same_status(reason, kind) -> None:
    failure = failure_of(reason)
    assert type(failure) is kind
    assert failure.message == reason.message
    assert failure.param is None  # a failure after admission names no field
    # the same status the runtime's reason had on the wire before the service was typed
    assert status_of_failure(failure) == status_of(reason)


@pytest.mark.parametrize("error", [
    APIError(400, "this request needs 9 sequences", param="n"),
    APIError(503, "The server is not accepting requests now.", headers={"Retry-After": "5"}),
    overloaded(3),
    api_error_of(GenerationPaused()),
    api_error_of(ClientGone()),
    api_error_of(EngineFailed()),
    api_error_of(RequestRefused("a token id is out of range", "prompt")),
])
def test_an_admission_refusal_round_trips(error: APIError) -> None:
    back = api_error_of_failure(failure_of_api_error(error))
    assert (back.status, back.message, back.param, back.headers) == \
        (error.status, error.message, error.param, error.headers)


def test_capacity_message_is_shared() -> None:
    failure = Unavailable(AT_CAPACITY, retry_after=1)
    error = api_error_of_failure(failure)
    assert error.body() == overloaded().body()
    assert error.headers == overloaded().headers

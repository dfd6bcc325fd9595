"""vLLM request extensions this server does not implement yet, refused with a clear 400.

A field that changes what is generated (or what the response carries) must not be dropped
silently: a client that sets it would get a plausible answer that ignores it. Unknown
fields that change nothing stay accepted (extra="allow"), as vLLM accepts them. Structured
outputs (response_format, structured_outputs, guided_*) are served: server.api.common.structured.
"""

from __future__ import annotations

from server.api.common.protocol import APIModel
from server.errors import bad_request

# field -> what the 400 says is missing. A field counts as set when it is truthy.
UNSUPPORTED = {
    "logprob_token_ids": "logprob_token_ids",
    "bad_words": "bad_words",
    "return_token_ids": "return_token_ids",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids",
}


def check_unsupported(req: APIModel) -> None:
    extra = req.model_extra or {}
    for name, what in UNSUPPORTED.items():
        if extra.get(name):
            raise bad_request(f"{what} is not supported by this server yet", name)
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != (getattr(req, "n", None) or 1):
        raise bad_request("best_of other than n is not supported by this server yet", "best_of")

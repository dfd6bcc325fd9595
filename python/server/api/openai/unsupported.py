"""vLLM request extensions this server does not implement yet, refused with a clear 400.

A field that changes what is generated (or what the response carries) must not be dropped
silently: a client that sets it would get a plausible answer that ignores it. Unknown
fields that change nothing stay accepted (extra="allow"), as vLLM accepts them.
"""

from __future__ import annotations

from typing import Any

from server.errors import bad_request
from server.api.openai.protocol.common import APIModel

# field -> what the 400 says is missing. A field counts as set when it is truthy.
UNSUPPORTED = {
    "use_beam_search": "beam search",
    "structured_outputs": "structured outputs",
    "logprob_token_ids": "logprob_token_ids",
    "prompt_embeds": "prompt embeddings",
    "bad_words": "bad_words",
    "return_token_ids": "return_token_ids",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids",
    # vLLM's older spellings of structured outputs.
    "guided_json": "structured outputs",
    "guided_regex": "structured outputs",
    "guided_choice": "structured outputs",
    "guided_grammar": "structured outputs",
}


def check_unsupported(req: APIModel) -> None:
    extra = req.model_extra or {}
    for name, what in UNSUPPORTED.items():
        if extra.get(name):
            raise bad_request(f"{what} is not supported by this server yet", name)
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != (getattr(req, "n", None) or 1):
        raise bad_request("best_of other than n is not supported by this server yet", "best_of")
    fmt: Any = getattr(req, "response_format", None)
    if fmt is None:
        fmt = extra.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if not isinstance(fmt, dict) or kind not in ("json_object", "json_schema", "structural_tag"):
        raise bad_request(
            "response_format must be an object whose type is one of 'text', 'json_object', "
            "'json_schema' or 'structural_tag'", "response_format",
        )
    raise bad_request(
        f"response_format of type '{kind}' needs structured outputs, which this server does "
        "not support yet; use type 'text' or leave response_format out", "response_format",
    )

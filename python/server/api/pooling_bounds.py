"""The bound on inputs per pooling request (``--max-pooling-inputs``), checked on the raw
body before it is parsed.

Parsing first would cost too much: pydantic reports one error per item of the wrong type,
and a 4 MB body holds a million items, seconds of the event loop to list. A list field over
the bound is a 400 in OpenAI's wording, naming the field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from server.api.http_io import parse
from server.api.pooling_protocol import (ClassifyRequest, CohereEmbedRequest, EmbeddingRequest,
                                         GenerativeScoringRequest, RerankRequest, ScoreRequest)
from server.errors import APIError, bad_request

M = TypeVar("M", bound=BaseModel)

# The list fields of each body checked against the bound; embeddings' ``input`` is
# _check_embed_input's (a flat list of token ids there is one input).
_LISTS: dict[type[BaseModel], tuple[str, ...]] = {
    CohereEmbedRequest: ("texts", "images", "inputs", "embedding_types"),
    ScoreRequest: ("queries", "documents", "text_1", "text_2", "data_1", "data_2"),
    RerankRequest: ("documents",),
    GenerativeScoringRequest: ("items", "label_token_ids"),
}


def parse_bounded(model: type[M], body: dict[str, Any], limit: int) -> M:
    """parse(model, body), once no list field of the body holds more than ``limit`` items."""
    if model in (EmbeddingRequest, ClassifyRequest):
        _check_embed_input(body, limit)
    else:
        for field in _LISTS[model]:
            value = body.get(field)
            if isinstance(value, list) and len(value) > limit:
                raise _too_long(field, len(value), limit)
    return parse(model, body)


def _too_long(param: str, n: int, limit: int) -> APIError:
    # OpenAI's wording for a list beyond its bound
    return bad_request(f"Invalid '{param}': array too long. Expected an array with maximum "
                       f"length {limit}, but got an array with length {n} instead.", param)


def _check_embed_input(body: dict[str, Any], limit: int) -> None:
    """The bound for embeddings' ``input``, where a flat list of integers is one prompt in
    token ids, however long. An inner list must hold integers only: checked here too,
    stopping at the first wrong item, for the same reason (``[["a", ...]]`` is one input
    and a million errors)."""
    value = body.get("input")
    if not isinstance(value, list):
        return
    if len(value) > limit:
        if all(type(v) is int for v in value):
            return  # one prompt: its length is the context's to bound
        raise _too_long("input", len(value), limit)
    for i, item in enumerate(value):
        if isinstance(item, list) and not all(type(t) is int for t in item):
            raise bad_request(f"Invalid 'input[{i}]': a list in input must hold token ids "
                              "(integers) only.", "input")

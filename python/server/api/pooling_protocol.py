"""Request bodies of the pooling routes, as vLLM 0.33 (and Cohere's and Jina's APIs for
/v2/embed and rerank) name their fields. Types are checked here (strict JSON types, unknown
fields ignored); ranges and the model's limits in server.api.pooling."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from server.api.common.chat_protocol import ChatMessage
from server.api.common.protocol import APIModel
from server.frontend.chat.request import ChatRequest

TokenIds = list[int]
EmbedInput = str | list[str] | TokenIds | list[TokenIds]
ScoreInput = str | list[str]


class PoolingFields(APIModel):
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    priority: int = 0
    request_id: str | None = Field(default=None, max_length=256)
    add_special_tokens: bool | None = None  # None: true for input, false for messages
    # vLLM 0.33's name for normalization (None: the model's pooler decides)
    use_activation: bool | None = None


class ClassifyRequest(PoolingFields):
    """POST /classify (and the base of the embedding bodies): ``input`` (text or token
    ids), or ``messages`` (one conversation through the chat template; vLLM's chat form,
    where ``add_generation_prompt`` defaults to false)."""

    input: EmbedInput | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class EmbeddingRequest(ClassifyRequest):
    """POST /v1/embeddings and /pooling: a ClassifyRequest's inputs, and how the vectors
    are written."""

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class CohereEmbedRequest(APIModel):
    """POST /v2/embed: Cohere's embed v2 (texts only)."""

    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[Any] | None = None
    input_type: str | None = None
    embedding_types: list[Literal["float", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = None
    max_tokens: int | None = None
    priority: int = 0


class ScoringFields(PoolingFields):
    """What /score and /rerank share (vLLM's ScoringRequestMixin): the cross-encoder's
    template kwargs, ``instruction`` folded into them (the kwargs' own key wins)."""

    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.instruction is not None:
            kwargs.setdefault("instruction", self.instruction)
        return kwargs


class ScoreRequest(ScoringFields):
    """POST /score, /v1/score: one of the pairs queries/documents, text_1/text_2,
    data_1/data_2 (vLLM's three spellings), 1:1, 1:N or N:N."""

    queries: ScoreInput | None = None
    documents: ScoreInput | None = None
    text_1: ScoreInput | None = None
    text_2: ScoreInput | None = None
    data_1: ScoreInput | None = None
    data_2: ScoreInput | None = None


class RerankDocument(APIModel):
    text: str


class RerankRequest(ScoringFields):
    """POST /rerank, /v1/rerank, /v2/rerank: vLLM's, Jina's and Cohere's shape."""

    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True


class GenerativeScoringRequest(APIModel):
    """POST /generative_scoring (vLLM 0.34): the probability of ``label_token_ids`` as the
    next token after query + item (item + query with ``item_first``), per item."""

    model: str | None = None
    query: str | TokenIds
    items: list[str] | list[TokenIds]
    label_token_ids: list[int]
    apply_softmax: bool = True
    item_first: bool = False
    add_special_tokens: bool = True
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    priority: int = 0
    request_id: str | None = Field(default=None, max_length=256)


def chat_of(req: ClassifyRequest) -> ChatRequest:
    """The conversation an embedding request's `messages` form renders (no tools)."""
    assert req.messages is not None
    return ChatRequest(
        messages=tuple(m.model_dump(exclude_none=True) for m in req.messages),
        chat_template=req.chat_template, chat_template_kwargs=req.chat_template_kwargs,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message)

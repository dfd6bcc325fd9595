"""POST /score, /v1/score, /rerank, /v1/rerank, /v2/rerank: relevance of documents to
queries, in vLLM's answer shapes.

Two ways to score, by the model (server.api.pooling.model_classifier):

- a cross-encoder (a classifier with one label): each (query, document) pair is one prompt
  (server.frontend.score_prompts: the score template, BERT's text pair with its token
  types, or the two texts concatenated), and its score is the classifier's one output
  after the activation (sigmoid unless the config says otherwise; ``use_activation:
  false``: the logit);
- any other pooling model: a bi-encoder, the cosine of the query's and each document's
  embedding (each text its own prompt).

Score pairs 1:1, 1:N or N:N (vLLM's three spellings of the pair of fields); rerank takes
one query and its documents, answers them sorted by score, the first ``top_n`` (0 or
absent: all), each with its document unless ``return_documents`` is false. Every list holds
at most --max-pooling-inputs items (server.api.pooling_bounds); a pair longer than the
context is the tokenizer's 400, as any prompt.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from actors.params.classify import Classifier
from quart import Quart, Response

from server.api.http_io import accepts, check_model, read_json
from server.api.pooling_bounds import parse_bounded
from server.api.pooling_protocol import RerankDocument, RerankRequest, ScoreRequest, ScoringFields
from server.errors import bad_request
from server.frontend.score_prompts import pair_prompts
from server.state import ServerState

__all__ = ["register"]


def _cosines(query: np.ndarray, docs: list[np.ndarray]) -> list[float]:
    q = query.astype(np.float64)
    qn = np.linalg.norm(q) or 1.0
    return [float(q @ d.astype(np.float64) / (qn * (np.linalg.norm(d) or 1.0))) for d in docs]


def _pairs_of(req: ScoreRequest) -> tuple[list[str], list[str]]:
    """The request's queries and documents, checked as vLLM checks them."""
    pairs = [(req.queries, req.documents, "queries"), (req.text_1, req.text_2, "text_1"),
             (req.data_1, req.data_2, "data_1")]
    given = [p for p in pairs if p[0] is not None or p[1] is not None]
    if len(given) != 1 or given[0][0] is None or given[0][1] is None:
        raise bad_request("give one pair of inputs: queries and documents (or text_1 and "
                          "text_2, or data_1 and data_2)", given[0][2] if given else None)
    left, right, param = given[0]
    lhs = [left] if isinstance(left, str) else list(left)  # type: ignore[arg-type]
    rhs = [right] if isinstance(right, str) else list(right)  # type: ignore[arg-type]
    if not lhs:
        raise bad_request("At least one text element must be given", param)
    if not rhs:
        raise bad_request("At least one text_pair element must be given", param)
    if len(lhs) != 1 and len(lhs) != len(rhs):
        raise bad_request("Input lengths must be either 1:1, 1:N or N:N", param)
    return lhs, rhs


def register(app: Quart, srv: ServerState, head: Classifier | None) -> None:
    from server.api.pooling import (classify_spec, embed, params_of, prompts_of, respond,
                                    spec_of,
                                    usage_of)

    limit = srv.config.max_pooling_inputs

    async def scores_of(req: ScoringFields, name: str, queries: list[str], docs: list[str]
                        ) -> tuple[list[float], list[np.ndarray], int]:
        """One score per document (against the one query, or its own), the vectors the
        engine answered and the prompt tokens."""
        add_special = req.add_special_tokens is not False
        if head is not None:  # a cross-encoder: one prompt per pair
            pairs = list(zip(queries * len(docs) if len(queries) == 1 else queries, docs))
            prompts, sep = await pair_prompts(srv.tokenizer, head, srv.config.chat_template,
                                              pairs, add_special, req.template_kwargs())
            vecs, tokens = await embed(srv, prompts, params_of(srv, req),
                                       classify_spec(head, req.use_activation, sep),
                                       req.request_id)
            return [float(v[0]) for v in vecs], vecs, tokens
        spec = spec_of(srv, name, True, None)
        vecs, tokens = await embed(srv, prompts_of(queries + docs, add_special),
                                   params_of(srv, req), spec, req.request_id)
        qs, ds = vecs[:len(queries)], vecs[len(queries):]
        scores = (_cosines(qs[0], ds) if len(qs) == 1
                  else [_cosines(q, [d])[0] for q, d in zip(qs, ds)])
        return scores, vecs, tokens

    async def score(req: ScoreRequest) -> Response:
        name = check_model(srv, req.model)
        queries, docs = _pairs_of(req)
        scores, vecs, tokens = await scores_of(req, name, queries, docs)
        return await respond(lambda: {
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": usage_of(tokens),
        }, vecs)

    async def rerank(req: RerankRequest) -> Response:
        name = check_model(srv, req.model)
        docs = [d.text if isinstance(d, RerankDocument) else d for d in req.documents]
        if not docs:
            raise bad_request("documents must not be empty", "documents")
        scores, vecs, tokens = await scores_of(req, name, [req.query], docs)

        def build() -> dict[str, Any]:
            order = sorted(range(len(docs)), key=lambda i: -scores[i])
            if req.top_n:
                order = order[:req.top_n]
            results = []
            for i in order:
                item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
                if req.return_documents:
                    item["document"] = {"text": docs[i]}
                results.append(item)
            return {
                "id": f"rerank-{uuid.uuid4().hex}", "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results,
            }

        return await respond(build, vecs)

    for path in ("/score", "/v1/score"):
        @app.post(path, endpoint=f"score{path.replace('/', '_')}")
        @accepts(ScoreRequest)
        async def score_route() -> Response:
            return await score(parse_bounded(ScoreRequest, await read_json(), limit))

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        @app.post(path, endpoint=f"rerank{path.replace('/', '_')}")
        @accepts(RerankRequest)
        async def rerank_route() -> Response:
            return await rerank(parse_bounded(RerankRequest, await read_json(), limit))

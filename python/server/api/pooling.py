"""The pooling routes: /v1/embeddings, /pooling, /v2/embed (Cohere), /score, /v1/score,
/rerank, /v1/rerank, /v2/rerank.

Which exist depends on the mode (``routes_enabled``), as vLLM registers them by task:
an encoder (BERT) or ``--runner pooling`` serves them and not generation; a generative
model with ``--pooler-config`` serves them beside generation; a generative model without
either serves none of them (404, as vLLM, whose routes do not exist for a generate model).
/classify exists for classification models only, and none is supported, so it is 404 in
every mode, as vLLM answers for a model without that task.

Each input becomes one prompt of one pooling request of the generation service
(server.frontend.pooled: the same admission slots, tokenizer actor and engine as a
completion, and the same typed failures), carrying a PoolingSpec: the engine computes the
prompt only and answers one float32 vector per prompt. Score and rerank are
bi-encoder cosines between the query's and each document's embedding.

A request carries at most ``--max-pooling-inputs`` inputs in each list field (2048 by
default, the OpenAI embeddings API's own limit): server.api.pooling_bounds, on the raw
body. Large responses are built and serialized in a worker thread.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from actors.params.pooling import PoolerConfig, PoolingSpec, matryoshka_of, pooler_from_dir
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from quart import Quart, Response

from server.api.http_io import accepts, built_json_response, check_model, read_json
from server.api.pooling_bounds import parse_bounded
from server.api.pooling_protocol import (CohereEmbedRequest, EmbeddingRequest, PoolingFields,
                                        RerankDocument, RerankRequest, ScoreRequest, chat_of)
from server.config import ServerConfig
from server.errors import api_error_of, bad_request
from server.frontend.chat.render import render_call
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.frontend.pooled import pool
from server.state import ServerState


def is_encoder(model: str | None) -> bool:
    """Whether --model names an encoder (BERT) directory: read from its config.json
    before anything loads, since routes are mounted then."""
    if not model or not Path(model).is_dir():
        return False
    cfg = Path(model) / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") == "bert"
    except (OSError, ValueError):
        return False


def pooling_only(cfg: ServerConfig) -> bool:
    """The pooling runner: the pooling routes, and no generation routes."""
    return cfg.runner == "pooling" or (cfg.runner == "auto" and is_encoder(cfg.model))


def routes_enabled(cfg: ServerConfig) -> bool:
    return pooling_only(cfg) or cfg.pooler_config is not None


@lru_cache(maxsize=4)
def _model_facts(model_dir: str, pooler_flag: str | None
                 ) -> tuple[PoolerConfig, int, bool, tuple[int, ...] | None]:
    """(the pooler, the embedding size, Matryoshka?, allowed sizes) of the loaded model:
    the checkpoint's sentence-transformers pooling (else LAST, normalized, vLLM's
    default for a converted decoder), overridden by --pooler-config."""
    base = pooler_from_dir(model_dir) or PoolerConfig()
    pooler = base if pooler_flag is None else PoolerConfig.parse(pooler_flag, base)
    hf = json.loads((Path(model_dir) / "config.json").read_text())
    matryoshka, allowed = matryoshka_of(hf)
    return pooler, int(hf["hidden_size"]), matryoshka, allowed


def _facts(srv: ServerState) -> tuple[PoolerConfig, int, bool, tuple[int, ...] | None]:
    return _model_facts(str(srv.tokenizer.name_or_path), srv.config.pooler_config)


def _spec(srv: ServerState, name: str, use_activation: bool | None,
          dimensions: int | None, param: str = "dimensions") -> PoolingSpec:
    """The request's PoolingSpec; a ``dimensions`` the model cannot give is vLLM's 400."""
    pooler, size, matryoshka, allowed = _facts(srv)
    if dimensions is not None:
        if not matryoshka:
            raise bad_request(f"Model {name!r} does not support Matryoshka embeddings; "
                              f"dimensions must be unset (received dimensions={dimensions}).",
                              param)
        if not 1 <= dimensions <= size:
            raise bad_request(f"Model {name!r} only supports dimensions in range "
                              f"[1, {size}], got {dimensions}.", param)
        if allowed is not None and dimensions not in allowed:
            raise bad_request(f"Model {name!r} only supports Matryoshka dimensions "
                              f"{list(allowed)}, got {dimensions}.", param)
    return pooler.spec(normalize=use_activation, dimensions=dimensions)


# Responses holding more floats than this are built and serialized in a worker thread
# (built_json_response): at the bound, 2048 vectors of 384 floats cost ~60 ms of .tolist()
# and orjson.dumps, during which the event loop would serve no stream and no /health.
OFF_LOOP_FLOATS = 8192


async def _respond(build: Callable[[], dict[str, Any]], vecs: list[np.ndarray]) -> Response:
    """The JSON response build() makes, off the event loop when ``vecs`` are large."""
    return await built_json_response(
        build, off_loop=sum(v.size for v in vecs) > OFF_LOOP_FLOATS)


def _json_array(items: Iterable[Any]) -> orjson.Fragment:
    """A JSON array serialized item by item: one orjson.dumps call holds the GIL (and so
    the event loop) for as long as it runs."""
    return orjson.Fragment(b"[" + b",".join(orjson.dumps(x) for x in items) + b"]")


def _prompts(value: Any, add_special_tokens: bool, param: str = "input") -> list[PromptInput]:
    if isinstance(value, str):
        return [PromptInput(text=value, add_special_tokens=add_special_tokens)]
    if not value:
        raise bad_request(f"{param} must not be empty", param)
    if all(isinstance(v, int) for v in value):
        return [PromptInput(token_ids=list(value))]
    return [PromptInput(token_ids=list(v)) if isinstance(v, list)
            else PromptInput(text=v, add_special_tokens=add_special_tokens) for v in value]


def _params(srv: ServerState, req: PoolingFields | None, *, truncate: int | None = None,
            side: str | None = None, priority: int = 0) -> SamplingParams:
    """SamplingParams carry what the tokenizer and scheduler read of a pooling request
    (truncation, priority); nothing is sampled. Truncation keeps the start ("right"), as
    the tokenizers of embedding models do, unless the request says otherwise."""
    if req is not None:
        truncate, side, priority = (req.truncate_prompt_tokens, req.truncation_side,
                                    req.priority)
    params = SamplingParams(max_tokens=1, truncate_prompt_tokens=truncate,
                            truncation_side=side or "right", priority=priority)
    try:
        params.validate(srv.limits)  # type: ignore[arg-type]
    except Exception as exc:  # RequestRefused: the field and vLLM's wording
        raise api_error_of(exc) from None
    return params


async def embed(srv: ServerState, prompts: list[PromptInput], params: SamplingParams,
                spec: PoolingSpec, request_id: str | None = None
                ) -> tuple[list[np.ndarray], int]:
    """One vector per prompt (float32, in order) and the prompt tokens they took.

    At most max_num_seqs prompts go in at once (one pooling request of the generation
    service each group, one after the other): a client's batch (LangChain sends 1000 texts
    a request) then never needs more admission slots than an idle server has, and it
    leaves room for other requests."""
    group = srv.config.engine.max_num_seqs
    vectors: list[np.ndarray] = []
    tokens = 0
    base = new_request_id(None, request_id)
    for start in range(0, len(prompts), group):
        part = prompts[start: start + group]
        pooled = await pool(context_of(srv), base if start == 0 else f"{base}-{start}", part,
                            params, spec)
        vectors.extend(pooled.vectors)
        tokens += pooled.prompt_tokens
    return vectors, tokens


def _usage(tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}


def _encoded(vec: np.ndarray, fmt: str) -> list[float] | str:
    return base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist()


def _cosines(query: np.ndarray, docs: list[np.ndarray]) -> list[float]:
    q = query.astype(np.float64)
    qn = np.linalg.norm(q) or 1.0
    return [float(q @ d.astype(np.float64) / (qn * (np.linalg.norm(d) or 1.0))) for d in docs]


def register(app: Quart, srv: ServerState) -> None:
    if not routes_enabled(srv.config):
        return
    limit = srv.config.max_pooling_inputs

    async def embeddings_of(req: EmbeddingRequest) -> tuple[str, list[np.ndarray], int]:
        name = check_model(srv, req.model)
        spec = _spec(srv, name, req.use_activation, req.dimensions)
        params = _params(srv, req)
        if (req.input is None) == (req.messages is None):
            raise bad_request("give exactly one of input or messages", "input")
        if req.messages is not None:
            assert srv.renderer is not None
            prompts = [PromptInput(render=render_call(srv.renderer, chat_of(req)),
                                   add_special_tokens=bool(req.add_special_tokens))]
        else:
            prompts = _prompts(req.input, req.add_special_tokens is not False)
        vecs, tokens = await embed(srv, prompts, params, spec, req.request_id)
        return name, vecs, tokens

    def embedding_request(body: dict[str, Any]) -> EmbeddingRequest:
        if "normalize" in body:  # vLLM 0.33 removed it, with this message
            raise bad_request("Parameter `normalize` was removed; use `use_activation` "
                              "instead.", "normalize")
        given = body.get("input")
        if "messages" not in body and isinstance(given, list) and given and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in given):
            body = {**body, "messages": given, "input": None}  # a conversation as input
        return parse_bounded(EmbeddingRequest, body, limit)

    @app.post("/v1/embeddings")
    @accepts(EmbeddingRequest)
    async def embeddings() -> Response:
        req = embedding_request(await read_json())
        name, vecs, tokens = await embeddings_of(req)
        return await _respond(lambda: {
            "id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": name,
            "data": [{"index": i, "object": "embedding",
                      "embedding": _encoded(v, req.encoding_format)}
                     for i, v in enumerate(vecs)],
            "usage": _usage(tokens),
        }, vecs)

    @app.post("/pooling")
    @accepts(EmbeddingRequest)
    async def pooling() -> Response:
        req = embedding_request(await read_json())
        if req.dimensions is not None:  # vLLM's /pooling refuses it
            raise bad_request("dimensions is currently not supported", "dimensions")
        name, vecs, tokens = await embeddings_of(req)
        return await _respond(lambda: {
            "id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": name,
            "data": [{"index": i, "object": "pooling", "data": _encoded(v, req.encoding_format)}
                     for i, v in enumerate(vecs)],
            "usage": _usage(tokens),
        }, vecs)

    @app.post("/v2/embed")
    @accepts(CohereEmbedRequest)
    async def cohere_embed() -> Response:
        req = parse_bounded(CohereEmbedRequest, await read_json(), limit)
        name = check_model(srv, req.model)
        given = [f for f in (req.texts, req.images, req.inputs) if f is not None]
        if len(given) != 1 or not given[0]:
            raise bad_request("Exactly one of texts, images, or inputs must be provided, "
                              "and it must be non-empty", "texts")
        if req.texts is None:
            raise bad_request("only texts can be embedded by this model", "texts")
        spec = _spec(srv, name, None, req.output_dimension, "output_dimension")
        truncate, side = {"NONE": (None, None), "START": (-1, "left"),
                          "END": (-1, "right")}[req.truncate]
        params = _params(srv, None, truncate=truncate, side=side, priority=req.priority)
        vecs, tokens = await embed(srv, _prompts(req.texts, True, "texts"), params, spec)
        kinds = req.embedding_types or ["float"]

        def build() -> dict[str, Any]:
            out: dict[str, Any] = {}
            for kind in dict.fromkeys(kinds):
                if kind == "float":
                    out[kind] = _json_array(v.tolist() for v in vecs)
                elif kind == "base64":
                    out[kind] = _json_array(_encoded(v, "base64") for v in vecs)
                else:  # sign bits, 8 a byte, most significant first (Cohere's binary types)
                    shift = 128 if kind == "binary" else 0
                    out[kind] = _json_array((np.packbits(v >= 0).astype(np.int16) - shift)
                                            .tolist() for v in vecs)
            return {
                "id": f"embd-{uuid.uuid4().hex}", "embeddings": out, "texts": req.texts,
                "meta": {"api_version": {"version": "2"},
                         "billed_units": {"input_tokens": tokens}},
                "response_type": "embeddings_by_type",
            }

        return await _respond(build, vecs)

    async def score(req: ScoreRequest) -> Response:
        name = check_model(srv, req.model)
        pairs = [(req.queries, req.documents, "queries"), (req.text_1, req.text_2, "text_1"),
                 (req.data_1, req.data_2, "data_1")]
        given = [p for p in pairs if p[0] is not None or p[1] is not None]
        if len(given) != 1 or given[0][0] is None or given[0][1] is None:
            raise bad_request("give one pair of inputs: queries and documents (or text_1 and "
                              "text_2, or data_1 and data_2)", given[0][2] if given else None)
        left, right, param = given[0]
        add_special = req.add_special_tokens is not False
        lhs = [left] if isinstance(left, str) else list(left)  # type: ignore[arg-type]
        rhs = [right] if isinstance(right, str) else list(right)  # type: ignore[arg-type]
        if not lhs:
            raise bad_request("At least one text element must be given", param)
        if not rhs:
            raise bad_request("At least one text_pair element must be given", param)
        if len(lhs) != 1 and len(lhs) != len(rhs):
            raise bad_request("Input lengths must be either 1:1, 1:N or N:N", param)
        spec = _spec(srv, name, True, None)
        vecs, tokens = await embed(srv, _prompts(lhs + rhs, add_special),
                                   _params(srv, req), spec, req.request_id)

        def build() -> dict[str, Any]:
            qs, ds = vecs[:len(lhs)], vecs[len(lhs):]
            scores = (_cosines(qs[0], ds) if len(qs) == 1
                      else [_cosines(q, [d])[0] for q, d in zip(qs, ds)])
            return {
                "id": f"score-{uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": name,
                "data": [{"index": i, "object": "score", "score": s}
                         for i, s in enumerate(scores)],
                "usage": _usage(tokens),
            }

        return await _respond(build, vecs)

    async def rerank(req: RerankRequest) -> Response:
        name = check_model(srv, req.model)
        docs = [d.text if isinstance(d, RerankDocument) else d for d in req.documents]
        if not docs:
            raise bad_request("documents must not be empty", "documents")
        spec = _spec(srv, name, True, None)
        vecs, tokens = await embed(srv, _prompts([req.query, *docs],
                                                 req.add_special_tokens is not False),
                                   _params(srv, req), spec, req.request_id)

        def build() -> dict[str, Any]:
            scores = _cosines(vecs[0], vecs[1:])
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

        return await _respond(build, vecs)

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

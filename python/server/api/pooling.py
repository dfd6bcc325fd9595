"""The pooling routes: /v1/embeddings, /pooling, /v2/embed (Cohere) here; /classify
(server.api.classify); /score, /v1/score, /rerank, /v1/rerank, /v2/rerank
(server.api.scoring).

Which exist depends on the mode (``routes_enabled``), as vLLM registers them by task:
an encoder (BERT), a sequence classifier or ``--runner pooling`` serves them and not
generation; a generative model with ``--pooler-config`` serves them beside generation; a
generative model without either serves none of them (404, as vLLM, whose routes do not
exist for a generate model). A sequence classifier (``model_classifier``: its config's
``*ForSequenceClassification``, with --hf-overrides) serves /classify and /pooling (its
probabilities), and score and rerank only with one label (a cross-encoder); it has no
embeddings routes. Any other model has no /classify (404, as vLLM).

Each input becomes one prompt of one pooling request of the generation service
(server.frontend.pooled: the same admission slots, tokenizer actor and engine as a
completion, and the same typed failures), carrying a PoolingSpec: the engine computes the
prompt only and answers one float32 vector per prompt (a classifier's: its head's
logits after the activation).

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
from typing import Any, TypeVar

import numpy as np
import orjson
from actors.params.classify import Classifier, classifier_of, hf_config_of
from actors.params.pooling import PoolerConfig, PoolingSpec, matryoshka_of, pooler_from_dir
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from quart import Quart, Response

from server.api.http_io import accepts, built_json_response, check_model, read_json
from server.api.pooling_bounds import parse_bounded
from server.api.pooling_protocol import (ClassifyRequest, CohereEmbedRequest, EmbeddingRequest,
                                        PoolingFields, chat_of)
from server.config import ServerConfig
from server.errors import api_error_of, bad_request
from server.frontend.chat.render import render_call
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.frontend.pooled import pool
from server.state import ServerState

R = TypeVar("R", bound=ClassifyRequest)


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


@lru_cache(maxsize=4)
def _classifier(model: str | None, overrides: str | None) -> Classifier | None:
    if not model or not Path(model).is_dir():
        return None
    try:
        return classifier_of(hf_config_of(model, json.loads(overrides or "null")))
    except ValueError:
        return None  # refused with its reason when the model loads


def model_classifier(cfg: ServerConfig) -> Classifier | None:
    """The sequence classifier --model (with --hf-overrides) is, None for other models:
    read from its config.json before anything loads, since routes are mounted then."""
    overrides = cfg.engine.hf_overrides
    return _classifier(cfg.model, json.dumps(overrides, sort_keys=True) if overrides else None)


def pooling_only(cfg: ServerConfig) -> bool:
    """The pooling runner: the pooling routes, and no generation routes."""
    return cfg.runner == "pooling" or (cfg.runner == "auto" and (
        is_encoder(cfg.model) or model_classifier(cfg) is not None))


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


def classify_spec(head: Classifier, use_activation: bool | None,
                  pair_sep: int | None = None) -> PoolingSpec:
    """A classifier's request: its pooling and head, its activation unless the request
    turns it off (``use_activation: false``: the logits)."""
    return PoolingSpec(head.pooling_type, classify=True, pair_sep=pair_sep,
                       activation="identity" if use_activation is False else head.activation)


def spec_of(srv: ServerState, name: str, use_activation: bool | None,
          dimensions: int | None, param: str = "dimensions") -> PoolingSpec:
    """The request's PoolingSpec; a ``dimensions`` the model cannot give is vLLM's 400."""
    head = model_classifier(srv.config)
    if head is not None:
        if dimensions is not None:
            raise bad_request("dimensions is currently not supported", param)
        return classify_spec(head, use_activation)
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


async def respond(build: Callable[[], dict[str, Any]], vecs: list[np.ndarray]) -> Response:
    """The JSON response build() makes, off the event loop when ``vecs`` are large."""
    return await built_json_response(
        build, off_loop=sum(v.size for v in vecs) > OFF_LOOP_FLOATS)


def _json_array(items: Iterable[Any]) -> orjson.Fragment:
    """A JSON array serialized item by item: one orjson.dumps call holds the GIL (and so
    the event loop) for as long as it runs."""
    return orjson.Fragment(b"[" + b",".join(orjson.dumps(x) for x in items) + b"]")


def prompts_of(value: Any, add_special_tokens: bool, param: str = "input") -> list[PromptInput]:
    if isinstance(value, str):
        return [PromptInput(text=value, add_special_tokens=add_special_tokens)]
    if not value:
        raise bad_request(f"{param} must not be empty", param)
    if all(isinstance(v, int) for v in value):
        return [PromptInput(token_ids=list(value))]
    return [PromptInput(token_ids=list(v)) if isinstance(v, list)
            else PromptInput(text=v, add_special_tokens=add_special_tokens) for v in value]


def params_of(srv: ServerState, req: PoolingFields | None, *, truncate: int | None = None,
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


def usage_of(tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}


def _encoded(vec: np.ndarray, fmt: str) -> list[float] | str:
    return base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist()


def request_of(model: type[R], body: dict[str, Any], limit: int) -> R:
    """An /v1/embeddings, /pooling or /classify body, bounded: a conversation given as
    ``input`` is its ``messages``; vLLM 0.33's removed ``normalize`` is its 400."""
    if "normalize" in body:  # vLLM 0.33 removed it, with this message
        raise bad_request("Parameter `normalize` was removed; use `use_activation` "
                          "instead.", "normalize")
    given = body.get("input")
    if "messages" not in body and isinstance(given, list) and given and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in given):
        body = {**body, "messages": given, "input": None}  # a conversation as input
    return parse_bounded(model, body, limit)


async def pooled_of(srv: ServerState, req: ClassifyRequest, dimensions: int | None = None
                    ) -> tuple[str, list[np.ndarray], int]:
    """(the model's name, one vector per input, the prompt tokens) of an input or
    messages request."""
    name = check_model(srv, req.model)
    spec = spec_of(srv, name, req.use_activation, dimensions)
    params = params_of(srv, req)
    if (req.input is None) == (req.messages is None):
        raise bad_request("give exactly one of input or messages", "input")
    if req.messages is not None:
        assert srv.renderer is not None
        prompts = [PromptInput(render=render_call(srv.renderer, chat_of(req)),
                               add_special_tokens=bool(req.add_special_tokens))]
    else:
        prompts = prompts_of(req.input, req.add_special_tokens is not False)
    vecs, tokens = await embed(srv, prompts, params, spec, req.request_id)
    return name, vecs, tokens


def register(app: Quart, srv: ServerState) -> None:
    if not routes_enabled(srv.config):
        return
    limit = srv.config.max_pooling_inputs
    from server.api import classify, scoring  # they build on this module's helpers

    head = model_classifier(srv.config)
    classify.register(app, srv, head)
    if head is None or head.num_labels == 1:  # vLLM: a classifier scores with one label
        scoring.register(app, srv, head)

    async def embeddings_of(req: EmbeddingRequest) -> tuple[str, list[np.ndarray], int]:
        return await pooled_of(srv, req, req.dimensions)

    @accepts(EmbeddingRequest)
    async def embeddings() -> Response:
        req = request_of(EmbeddingRequest, await read_json(), limit)
        name, vecs, tokens = await embeddings_of(req)
        return await respond(lambda: {
            "id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": name,
            "data": [{"index": i, "object": "embedding",
                      "embedding": _encoded(v, req.encoding_format)}
                     for i, v in enumerate(vecs)],
            "usage": usage_of(tokens),
        }, vecs)

    @app.post("/pooling")
    @accepts(EmbeddingRequest)
    async def pooling() -> Response:
        req = request_of(EmbeddingRequest, await read_json(), limit)
        if req.dimensions is not None:  # vLLM's /pooling refuses it
            raise bad_request("dimensions is currently not supported", "dimensions")
        name, vecs, tokens = await embeddings_of(req)
        return await respond(lambda: {
            "id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": name,
            "data": [{"index": i, "object": "pooling", "data": _encoded(v, req.encoding_format)}
                     for i, v in enumerate(vecs)],
            "usage": usage_of(tokens),
        }, vecs)

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
        spec = spec_of(srv, name, None, req.output_dimension, "output_dimension")
        truncate, side = {"NONE": (None, None), "START": (-1, "left"),
                          "END": (-1, "right")}[req.truncate]
        params = params_of(srv, None, truncate=truncate, side=side, priority=req.priority)
        vecs, tokens = await embed(srv, prompts_of(req.texts, True, "texts"), params, spec)
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

        return await respond(build, vecs)

    if head is None:  # a classifier has no embeddings routes (vLLM: no embed task)
        app.post("/v1/embeddings")(embeddings)
        app.post("/v2/embed")(cohere_embed)

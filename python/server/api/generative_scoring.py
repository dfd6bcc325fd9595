"""POST /generative_scoring: vLLM 0.34's generative scoring on a causal LM (the generate
runner, the default model included).

For each item the prompt is query + item (item + query with ``item_first``): a text query
is encoded with ``add_special_tokens``, a text item without (no second BOS), token ids as
given; the prompt keeps its first max_model_len - 1 tokens. One generation of one token per
item reports the logprobs of ``label_token_ids`` at the next position (``logprob_token_ids``,
the full vocabulary's log-softmax, temperature 1 and no filtering so that nothing sampled
changes them). The item's score is the first label's probability: normalized over the
labels alone (``apply_softmax``, the default) or the model's own (exp of its logprob).

The answer is vLLM's: ``id`` generative-scoring-<request id>, ``object`` "list", ``data``
one ``{"index", "object": "score", "score"}`` per item, ``usage`` with the one completion
token per item. Errors are vLLM's 400s (labels out of the vocabulary, no labels, no items)
and the generation service's failures.
"""

from __future__ import annotations

import math
import time

import trio
from actors.errors import RequestRefused
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from quart import Quart, Response

from server.api.http_io import accepts, built_json_response, check_model, read_json
from server.api.pooling_bounds import parse_bounded
from server.api.pooling_protocol import GenerativeScoringRequest
from server.errors import api_error_of, bad_request
from server.frontend import service
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.state import ServerState

__all__ = ["register"]


def _probabilities(logprobs: list[float], apply_softmax: bool) -> list[float]:
    if not apply_softmax:
        return [math.exp(lp) for lp in logprobs]
    top = max(logprobs)
    exps = [math.exp(lp - top) for lp in logprobs]
    total = sum(exps)
    return [e / total for e in exps]


def register(app: Quart, srv: ServerState) -> None:
    limit = srv.config.max_pooling_inputs

    @app.post("/generative_scoring")
    @accepts(GenerativeScoringRequest)
    async def generative_scoring() -> Response:
        req = parse_bounded(GenerativeScoringRequest, await read_json(), limit)
        name = check_model(srv, req.model)
        assert srv.limits is not None and srv.tokenizer is not None
        vocab = srv.limits.vocab_size
        for token_id in req.label_token_ids:
            if not 0 <= token_id < vocab:
                raise bad_request(f"label_token_id {token_id} is out of vocabulary range "
                                  f"[0, {vocab}). Please provide valid token IDs.",
                                  "label_token_ids")
        if not req.label_token_ids:
            raise bad_request("label_token_ids must contain at least one token ID.",
                              "label_token_ids")
        if not req.items:
            raise bad_request("items must contain at least one item.", "items")
        params = SamplingParams(max_tokens=1, temperature=1.0,
                                logprob_token_ids=tuple(req.label_token_ids),
                                priority=req.priority, cache_salt=req.cache_salt)
        try:
            params.validate(srv.limits)
        except RequestRefused as exc:  # the field and vLLM's wording
            raise api_error_of(exc) from None
        tok = srv.tokenizer
        keep = (srv.limits.max_model_len or 1 << 62) - 1

        def build() -> list[PromptInput]:
            query = (tok.encode(req.query, add_special_tokens=req.add_special_tokens)
                     if isinstance(req.query, str) else list(req.query))
            out = []
            for item in req.items:
                ids = (tok.encode(item, add_special_tokens=False) if isinstance(item, str)
                       else list(item))
                ids = ids + query if req.item_first else query + ids
                out.append(PromptInput(token_ids=ids[:keep]))
            return out

        prompts = await trio.to_thread.run_sync(build)
        rid = f"generative-scoring-{new_request_id(None, req.request_id)}"
        gen = await service.start(context_of(srv), rid, prompts, params)
        result = await gen.collect()
        labels = list(req.label_token_ids)
        data = []
        for i, choice in enumerate(result.choices):
            listed = {t.token_id: t.logprob for t in choice.logprobs[0].top}
            probs = _probabilities([listed[t] for t in labels], req.apply_softmax)
            data.append({"index": i, "object": "score", "score": probs[0]})
        usage = result.usage
        return await built_json_response(lambda: {
            "id": rid, "object": "list", "created": int(time.time()), "model": name,
            "data": data,
            "usage": {"prompt_tokens": usage.prompt_tokens,
                      "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                      "completion_tokens": usage.completion_tokens,
                      "prompt_tokens_details": None},
        }, off_loop=False)

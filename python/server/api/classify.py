"""POST /classify: a sequence classifier's labels and probabilities, vLLM's answer.

Mounted only for a classifier (server.api.pooling.model_classifier: config.json's
``*ForSequenceClassification``, with --hf-overrides); any other model has no such route
(404, as vLLM, which registers it for the classify task only). The body is vLLM's
ClassificationRequest: ``input`` (a text, texts, token ids) or ``messages``, with
``use_activation`` (false: the raw logits), truncation and priority. Each input is one
prompt of one pooling request whose spec says ``classify``: the engine pools the prompt
(CLS for BERT, the last row for a decoder), runs the head and the activation and answers
``num_labels`` floats; ``label`` is config.json's ``id2label`` of the largest.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from actors.params.classify import Classifier
from quart import Quart, Response

from server.api.http_io import accepts, read_json
from server.api.pooling_protocol import ClassifyRequest
from server.state import ServerState

__all__ = ["register"]


def register(app: Quart, srv: ServerState, head: Classifier | None) -> None:
    if head is None:
        return
    from server.api.pooling import pooled_of, request_of, respond, usage_of

    limit = srv.config.max_pooling_inputs

    @app.post("/classify")
    @accepts(ClassifyRequest)
    async def classify() -> Response:
        req = request_of(ClassifyRequest, await read_json(), limit)
        name, vecs, tokens = await pooled_of(srv, req)

        def build() -> dict[str, Any]:
            data = []
            for i, v in enumerate(vecs):
                best = int(np.argmax(v))
                data.append({"index": i, "label": head.labels[best] if best < len(head.labels)
                             else None, "probs": v.tolist(), "num_classes": int(v.size)})
            return {"id": f"classify-{uuid.uuid4().hex}", "object": "list",
                    "created": int(time.time()), "model": name, "data": data,
                    "usage": usage_of(tokens)}

        return await respond(build, vecs)

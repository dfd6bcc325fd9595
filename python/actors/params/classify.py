"""Sequence classifiers: what a checkpoint's config.json says about its classification head,
read the way vLLM reads it. Standard library only: the server reads it before anything loads
(which routes to mount) and the loader reads it to build the head.

A classifier is a model whose ``architectures`` names ``*ForSequenceClassification``:

- ``BertForSequenceClassification``: the encoder, its CLS row, BERT's pooler (dense, tanh)
  and ``classifier`` (a linear layer with bias);
- a decoder family's (``Qwen3ForSequenceClassification`` ...): the last row and ``score``
  (a linear layer, no bias);
- a causal LM turned into one by ``--hf-overrides`` (vLLM's recipe for the original Qwen3
  rerankers): ``classifier_from_token`` names label tokens whose LM-head rows make the
  ``score`` rows. ``method`` ``from_2_way_softmax`` (what ``is_original_qwen3_reranker``
  implies) makes one label, the difference of the second token's row and the first's, so
  that its sigmoid is the softmax of the pair; ``no_post_processing`` one label per token.

The activation applied to the logits when a request leaves ``use_activation`` on follows
transformers' loss rules as vLLM does: ``problem_type`` (regression: none;
multi-label: sigmoid; single-label: softmax), else a sentence-transformers cross-encoder's
``activation_fn``, else sigmoid for one label and softmax for more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ACTIVATIONS", "Classifier", "classifier_of", "hf_config_of"]

ACTIVATIONS = ("identity", "sigmoid", "softmax", "tanh")
METHODS = ("from_2_way_softmax", "no_post_processing")

# sentence-transformers' activation_fn (a torch.nn module's qualified name) -> ours
_ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Softmax": None,  # the label count decides, as vLLM
}


@dataclass(frozen=True, slots=True)
class Classifier:
    """One checkpoint's classification head and how its inputs are formed."""

    architecture: str
    num_labels: int
    labels: tuple[str | None, ...]  # id2label, by index (None where it names none)
    activation: str  # one of ACTIVATIONS: what use_activation applies
    pooling_type: str  # CLS (BERT) or LAST (decoders)
    use_sep_token: bool  # a pair is the tokenizer's text pair; else query + document
    from_tokens: tuple[str, ...] = ()  # classifier_from_token, with ``method``
    method: str | None = None
    bert: bool = False  # BERT's pooler + classifier, else a decoder's score layer


def hf_config_of(model_dir: str | Path, overrides: dict[str, Any] | None = None
                 ) -> dict[str, Any] | None:
    """A directory's config.json with ``--hf-overrides`` merged over it (one level, as
    vLLM merges a flat override); None when there is none to read."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    return {**raw, **(overrides or {})}


def classifier_of(hf: dict[str, Any] | None) -> Classifier | None:
    """The classifier a config describes, None for any other model. Raises ValueError for
    a classifier this server cannot build (an unknown method or activation)."""
    if not hf:
        return None
    archs = [a for a in hf.get("architectures") or () if isinstance(a, str)]
    arch = next((a for a in archs if a.endswith("ForSequenceClassification")), None)
    if arch is None:
        return None
    bert = hf.get("model_type") == "bert"
    if bert and arch != "BertForSequenceClassification":
        raise ValueError(f"{arch} is not supported (BERT: BertForSequenceClassification)")
    tokens = tuple(hf.get("classifier_from_token") or ())
    method = hf.get("method")
    if hf.get("is_original_qwen3_reranker"):
        if len(tokens) != 2:
            raise ValueError("is_original_qwen3_reranker needs classifier_from_token with "
                             'two tokens, e.g. ["no", "yes"]')
        method = "from_2_way_softmax"
    if method is None and tokens:
        raise ValueError("classifier_from_token needs a method (from_2_way_softmax or "
                         "no_post_processing) or is_original_qwen3_reranker")
    if method is not None:
        if bert or method not in METHODS:
            raise ValueError(f"method {method!r} is not supported (supported: "
                             f"{', '.join(METHODS)}, on a causal LM)")
        if method == "from_2_way_softmax" and len(tokens) != 2:
            raise ValueError("from_2_way_softmax needs two classifier_from_token tokens")
        if not tokens:
            raise ValueError(f"method {method} needs classifier_from_token")
    id2label = {int(k): v for k, v in (hf.get("id2label") or {}).items()}
    if method == "from_2_way_softmax":
        num_labels = 1
    elif method == "no_post_processing":
        num_labels = len(tokens)
    else:
        num_labels = int(hf.get("num_labels") or len(id2label) or 2)
    return Classifier(
        architecture=arch, num_labels=num_labels,
        labels=tuple(id2label.get(i) for i in range(num_labels)),
        activation=_activation(hf, num_labels),
        pooling_type="CLS" if bert else "LAST",
        # vLLM: a cross-encoder pairs with the separator; an LM as reranker concatenates
        use_sep_token=bool(hf.get("use_sep_token", method is None)),
        from_tokens=tokens, method=method, bert=bert)


def _activation(hf: dict[str, Any], num_labels: int) -> str:
    default = "sigmoid" if num_labels < 2 else "softmax"
    problem = hf.get("problem_type") or ""
    if problem == "regression":
        return "identity"
    if problem == "multi_label_classification":
        return "sigmoid"
    if problem == "single_label_classification":
        return default
    st = hf.get("sentence_transformers")
    name = (st.get("activation_fn") if isinstance(st, dict) else None) \
        or hf.get("sbert_ce_default_activation_function")
    if name is None:
        return default
    if name not in _ST_ACTIVATIONS:
        raise ValueError(f"activation_fn {name!r} is not supported (supported: "
                         f"{', '.join(_ST_ACTIVATIONS)})")
    return _ST_ACTIVATIONS[name] or default

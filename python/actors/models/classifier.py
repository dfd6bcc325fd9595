"""ClassifierHead: the layers a sequence classifier puts after its pooled row, and the
activation a request may apply to their logits.

The facts come from actors.params.classify; the loader builds the head beside the model
(``loader.hf``), diverts the head's tensors out of the checkpoint on their way to the model
(``divert``) and attaches it as ``model.classifier``. The runner applies it to a pooling
request's vector when its spec says ``classify`` (actors.core.runner.pooling_rows):

- BERT: ``tanh(dense(cls))`` (BERT's pooler), then ``classifier`` (with bias);
- a decoder: ``score`` (no bias; a bias in the checkpoint is used, as vLLM does);
- a causal LM made a classifier (``classifier_from_token``): the ``score`` rows are taken
  from the LM head (or the tied embedding) as its tensor passes: ``from_2_way_softmax``
  one row, the second token's minus the first's; ``no_post_processing`` one per token.

The head computes in float32 whatever the model's dtype, as vLLM's pooling heads do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from actors.params.classify import Classifier

__all__ = ["ClassifierHead", "activate"]

# the checkpoint names of a BERT head (with or without the "bert." prefix on the pooler)
_BERT = {"bert.pooler.dense.weight": "dense_weight", "bert.pooler.dense.bias": "dense_bias",
         "pooler.dense.weight": "dense_weight", "pooler.dense.bias": "dense_bias",
         "classifier.weight": "weight", "classifier.bias": "bias"}
_DECODER = {"score.weight": "weight", "score.bias": "bias"}
# where a causal LM keeps the rows classifier_from_token reads, preferred first
_LM_ROWS = ("lm_head.weight", "model.embed_tokens.weight")


class ClassifierHead(nn.Module):
    def __init__(self, info: Classifier, hidden_size: int,
                 label_token_ids: tuple[int, ...] = ()) -> None:
        """``label_token_ids``: the ids of ``info.from_tokens`` (the recipe only)."""
        super().__init__()
        self.info = info
        self.num_labels = info.num_labels
        self._hidden = hidden_size
        self._label_ids = label_token_ids
        self._lm_rows: dict[str, torch.Tensor] = {}
        self.dense_weight: torch.Tensor | None = None
        self.dense_bias: torch.Tensor | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def divert(self, weights: Iterable[tuple[str, torch.Tensor]]
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors less the head's (kept here); the LM head a recipe reads
        passes on to the model as well, its label rows copied."""
        names = _BERT if self.info.bert else _DECODER
        for name, tensor in weights:
            if self.info.method is not None:
                if name in _LM_ROWS:
                    self._lm_rows[name] = tensor[list(self._label_ids)].float().clone()
                yield name, tensor
            elif name in names:
                setattr(self, names[name], tensor.detach().float().clone())
            else:
                yield name, tensor

    def finish(self) -> None:
        """Builds the recipe's rows and checks every part came, with its shape. Raises
        ValueError naming what is missing or wrong."""
        if self.info.method is not None:
            rows = next((self._lm_rows[n] for n in _LM_ROWS if n in self._lm_rows), None)
            if rows is None:
                raise ValueError("classifier_from_token: the checkpoint has no LM head rows")
            self.weight = (rows[1:2] - rows[0:1] if self.info.method == "from_2_way_softmax"
                           else rows)
            self._lm_rows = {}
        want = {"weight": (self.num_labels, self._hidden)}
        if self.info.bert:
            want.update(dense_weight=(self._hidden, self._hidden), dense_bias=(self._hidden,),
                        bias=(self.num_labels,))
        for part, shape in want.items():
            got = getattr(self, part)
            if got is None:
                raise ValueError(f"{self.info.architecture}: the checkpoint lacks the "
                                 f"classification head's {part}")
            if tuple(got.shape) != shape:
                raise ValueError(f"{self.info.architecture}: head {part} has shape "
                                 f"{tuple(got.shape)}, expected {shape}")

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., num_labels] logits, float32."""
        assert self.weight is not None
        x = pooled.float()
        if self.dense_weight is not None:
            x = torch.tanh(F.linear(x, self.dense_weight, self.dense_bias))
        return F.linear(x, self.weight, self.bias)


def activate(logits: torch.Tensor, activation: str) -> torch.Tensor:
    """The request's activation over the last axis (ACTIVATIONS; "identity": none)."""
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    if activation == "softmax":
        return torch.softmax(logits, dim=-1)
    if activation == "tanh":
        return torch.tanh(logits)
    return logits

"""Pooling: how a prompt's final hidden states become one vector (embeddings).

``PoolingSpec`` is what one pooling request carries to the core (plain data, like
SamplingParams); ``PoolerConfig`` is the server's default, from ``--pooler-config`` (vLLM's
JSON) or, for a sentence-transformers checkpoint, from its own files (``1_Pooling/
config.json`` names the pooling mode, a ``Normalize`` module in ``modules.json`` the
normalization), as vLLM reads them. Standard library only: the CLI imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.params.limits import RequestLimits
    from actors.params.sampling import SamplingParams

__all__ = ["POOLING_TYPES", "PoolerConfig", "PoolingSpec", "check_pooling_prompt",
           "matryoshka_of", "pooler_from_dir"]

POOLING_TYPES = ("LAST", "MEAN", "CLS")


@dataclass(frozen=True, slots=True)
class PoolingSpec:
    """One request's pooling: ``pooling_type`` over the prompt's rows, then the first
    ``dimensions`` components (Matryoshka; None: all), then L2 normalization if
    ``normalize``.

    ``classify``: a sequence classifier's request (actors.params.classify): the pooled row
    goes through the model's classification head and then ``activation`` (one of
    ACTIVATIONS) instead; ``dimensions`` and ``normalize`` do not apply. ``pair_sep``: a
    text pair for a BERT cross-encoder: every row after the first occurrence of this token
    (the separator that ends the first text) is token type 1, as the tokenizer's
    token_type_ids of a pair say."""

    pooling_type: str = "LAST"
    normalize: bool = True
    dimensions: int | None = None
    classify: bool = False
    activation: str = "identity"
    pair_sep: int | None = None

    def __post_init__(self) -> None:
        from actors.params.classify import ACTIVATIONS

        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, "
                             f"got {self.activation!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    """The server's pooling defaults (a request may turn normalization off with
    ``use_activation: false`` and ask for fewer ``dimensions``)."""

    pooling_type: str = "LAST"
    normalize: bool = True

    def spec(self, *, normalize: bool | None = None, dimensions: int | None = None
             ) -> PoolingSpec:
        return PoolingSpec(self.pooling_type, self.normalize if normalize is None else normalize,
                           dimensions)

    @classmethod
    def parse(cls, text: str, default: PoolerConfig | None = None) -> PoolerConfig:
        """``--pooler-config`` JSON: ``pooling_type`` (or ``seq_pooling_type``) LAST, MEAN
        or CLS; ``use_activation`` (vLLM 0.33's name) or ``normalize`` (its older one)
        true/false. Keys left out keep ``default``'s values. Raises ValueError."""
        base = default or cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--pooler-config is not valid JSON: {exc.msg}") from None
        if not isinstance(raw, dict):
            raise ValueError("--pooler-config must be a JSON object")
        known = {"pooling_type", "seq_pooling_type", "use_activation", "normalize"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"--pooler-config: unsupported keys {', '.join(unknown)} "
                             f"(supported: {', '.join(sorted(known))})")
        if "pooling_type" in raw and "seq_pooling_type" in raw:
            raise ValueError("Cannot set both `pooling_type` and `seq_pooling_type`")
        kind = raw.get("pooling_type", raw.get("seq_pooling_type", base.pooling_type))
        if not isinstance(kind, str) or kind.upper() not in POOLING_TYPES:
            raise ValueError(f"--pooler-config: pooling_type must be one of "
                             f"{', '.join(POOLING_TYPES)}, got {kind!r}")
        if "use_activation" in raw and "normalize" in raw:
            raise ValueError("--pooler-config: give use_activation or normalize, not both")
        norm = raw.get("use_activation", raw.get("normalize", base.normalize))
        if not isinstance(norm, bool):
            raise ValueError(f"--pooler-config: use_activation must be true or false, "
                             f"got {norm!r}")
        return cls(kind.upper(), norm)


def pooler_from_dir(model_dir: str | Path) -> PoolerConfig | None:
    """A sentence-transformers checkpoint's own pooling (None when it has none): the mode
    of ``1_Pooling/config.json`` (mean, cls or lasttoken) and whether ``modules.json``
    lists a Normalize module."""
    d = Path(model_dir)
    modules_file = d / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    pooling_dir = next((m.get("path", "") for m in modules
                        if str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling_dir is None:
        return None
    cfg_file = d / pooling_dir / "config.json"
    cfg: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    if cfg.get("pooling_mode_cls_token"):
        kind = "CLS"
    elif cfg.get("pooling_mode_lasttoken"):
        kind = "LAST"
    elif cfg.get("pooling_mode_mean_tokens", True):
        kind = "MEAN"
    else:
        return None  # max or sqrt-length pooling: not implemented
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    return PoolerConfig(kind, normalize)


def matryoshka_of(hf_config: dict[str, Any]) -> tuple[bool, tuple[int, ...] | None]:
    """Whether a model's embeddings may be cut to fewer dimensions (config.json's
    ``is_matryoshka`` or ``matryoshka_dimensions``, as vLLM reads them), and the allowed
    sizes when it names them."""
    dims = hf_config.get("matryoshka_dimensions")
    allowed = tuple(int(x) for x in dims) if isinstance(dims, list) else None
    return bool(hf_config.get("is_matryoshka")) or allowed is not None, allowed


def check_pooling_prompt(token_ids: list[int], params: SamplingParams,
                         limits: RequestLimits) -> list[int]:
    """check_prompt under pooling's rule: no output token, so the prompt may fill the
    whole context (vLLM's rule and message for embeddings); the refusal names ``input``."""
    from actors.params.prompt import POOLING, check_prompt

    return check_prompt(token_ids, params, limits, POOLING)

"""GenerationDefaults: the model's own request defaults, read once from generation_config.json.

``--generation-config`` (EngineConfig.generation_config) says where they come from, as in
vLLM: ``auto`` the model directory's generation_config.json (none when it has no such
file), ``vllm`` none at all, or a directory holding a generation_config.json. The keys
that become defaults are vLLM's nine sampling keys, renamed to SamplingParams fields
(Hugging Face's ``max_new_tokens`` is our ``max_tokens``); a key that is absent or null is
no default. As in vLLM, ``do_sample: false`` does not remove the sampling keys.

The engine loads them (``LLMEngine.generation_defaults``) and publishes them in
``EngineInfo.generation_defaults``; the server and the offline ``LLM`` read only that, so
the file is mapped in this one place. A request's own value always wins over a default.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_CONFIG_KEYS", "GenerationDefaults", "load_generation_defaults"]

# generation_config.json key -> SamplingParams field (vLLM 0.33 maps these nine).
GENERATION_CONFIG_KEYS = {
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
    "skip_special_tokens": "skip_special_tokens",
}


@dataclass(frozen=True, slots=True)
class GenerationDefaults(Mapping[str, Any]):
    """SamplingParams field -> default value; a read-only mapping (frozen: one copy is
    shared by every request)."""

    items_: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_file_keys(cls, raw: Mapping[str, Any]) -> GenerationDefaults:
        """The defaults a generation_config.json's contents give."""
        return cls(tuple((ours, raw[theirs]) for theirs, ours in GENERATION_CONFIG_KEYS.items()
                         if raw.get(theirs) is not None))

    def __getitem__(self, name: str) -> Any:
        for key, value in self.items_:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)


def load_generation_defaults(model_dir: str | Path, setting: str) -> GenerationDefaults:
    """The defaults --generation-config ``setting`` selects for the model in ``model_dir``.
    Raises FileNotFoundError for a directory without generation_config.json, and
    ValueError for a file that is not a JSON object."""
    if setting == "vllm":
        return GenerationDefaults()
    folder = Path(model_dir) if setting == "auto" else Path(setting)
    path = folder / "generation_config.json"
    if not path.is_file():
        if setting != "auto":
            raise FileNotFoundError(f"no generation_config.json in {folder}")
        return GenerationDefaults()
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a JSON object")  # noqa: TRY004 (as json)
    return GenerationDefaults.from_file_keys(raw)

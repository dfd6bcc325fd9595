"""A model without a chat template (a base model such as Gemma 3 270M) answers every chat
request as vLLM 0.34 does: 400 BadRequestError with vLLM's message (its
ChatTemplateResolutionError), streamed or not; /v1/completions serves as usual.

The model is a tiny random Llama carrying the default model's tokenizer with its template
taken out, served by a real `python -m server`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server.frontend.chat_template import NO_TEMPLATE_MESSAGE
from server_helpers import ServerProcess


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_path: Path) -> Path:
    import torch
    from actors.loader import prepare_model_dir
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = tmp_path_factory.mktemp("no-template") / "tiny-base"
    # head_dim 64: a head size the core's paged attention serves
    cfg = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    converted = prepare_model_dir(default_model_path)[1]
    shutil.copy(converted / "tokenizer.json", out)
    config = json.loads((converted / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)  # (transformers 5 keeps it in chat_template.jinja)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    srv = ServerProcess("--model", str(model_dir)).wait_ready()
    yield srv.url
    log = srv.log()
    assert srv.stop() == 0, log


VLLM_BODY = {"error": {"message": NO_TEMPLATE_MESSAGE, "type": "BadRequestError",
                       "param": None, "code": 400}}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_is_refused_with_vllms_message(server: str, stream: bool) -> None:
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-base", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "stream": stream})
    assert r.status_code == 400 and r.json() == VLLM_BODY, r.text


def test_completions_still_serve(server: str) -> None:
    assert [m["id"] for m in httpx.get(server + "/v1/models").json()["data"]] == ["tiny-base"]
    r = httpx.post(server + "/v1/completions", timeout=60, json={
        "model": "tiny-base", "prompt": "Once upon a time", "max_tokens": 4,
        "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4

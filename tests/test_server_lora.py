"""LoRA through the real server: --lora-modules adapters served as ``model``, through the
openai SDK, against transformers + peft's merged model; /v1/models cards; runtime load and
unload while another stream is served, with no failed request; vLLM's bodies and statuses."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from hf_reference import gguf_reference
from lora_helpers import ALL_TARGETS, make_adapter
from server_helpers import ServerProcess, default_tokenizer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The capital of France is a city where"


@pytest.fixture(scope="module")
def adapters(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """name -> (directory, merged reference); 'big' has rank 16 (> --max-lora-rank 8)."""
    ref = gguf_reference(default_model_path)
    out: dict[str, Any] = {"base": (None, ref)}
    specs = {"ad1": (8, ALL_TARGETS), "ad2": (4, ["q_proj", "v_proj", "down_proj"]),
             "ad3": (2, ["o_proj"]), "big": (16, ["q_proj"])}
    for i, (name, (rank, targets)) in enumerate(specs.items()):
        d = tmp_path_factory.mktemp(f"srv-lora-{name}")
        out[name] = (d, make_adapter(ref, d, seed=7 + i, rank=rank, alpha=2 * rank,
                                     targets=targets))
    return out


@pytest.fixture(scope="module")
def server(adapters: dict) -> Any:
    proc = ServerProcess("--dtype", "float32", "--api-key", KEY, "--enable-lora",
                         "--max-loras", "2", "--max-lora-rank", "8",
                         "--lora-modules", f"ad1={adapters['ad1'][0]}",
                         env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def client(server: Any) -> Any:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                       timeout=120) as c:
        yield c


def post(server: Any, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def reference_greedy(merged: Any, n: int) -> tuple[str, list[float]]:
    tok = default_tokenizer()
    ids = tok.encode(PROMPT, add_special_tokens=False)
    lps = []
    with torch.no_grad():
        for _ in range(n):
            lp = torch.log_softmax(merged(torch.tensor([ids])).logits[0, -1].float(), -1)
            t = int(lp.argmax())
            lps.append(float(lp[t]))
            ids.append(t)
    return tok.decode(ids[-n:]), lps


def complete(client: openai.OpenAI, model: str, n: int = 6) -> Any:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=0,
                                     logprobs=1, extra_body={"ignore_eos": True})


@pytest.mark.parametrize("name", ["ad1", "base"])
def test_adapter_matches_peft_merged(client: openai.OpenAI, adapters: dict, name: str) -> None:
    model = MODEL if name == "base" else name
    got = complete(client, model)
    assert got.model == model
    text, lps = reference_greedy(adapters[name][1], 6)
    assert got.choices[0].text == text
    assert torch.allclose(torch.tensor(got.choices[0].logprobs.token_logprobs),
                          torch.tensor(lps), atol=2e-3)


def test_adapter_changes_output_and_chat_routes(client: openai.OpenAI) -> None:
    on, off = complete(client, "ad1"), complete(client, MODEL)
    assert on.choices[0].logprobs.token_logprobs != off.choices[0].logprobs.token_logprobs
    chat = client.chat.completions.create(model="ad1", max_tokens=5, temperature=0,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert chat.model == "ad1" and chat.choices[0].message.content


def test_models_lists_adapters(server: Any, adapters: dict) -> None:
    data = httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]
    cards = {c["id"]: c for c in data}
    assert cards[MODEL]["parent"] is None
    assert cards["ad1"]["parent"] == MODEL
    assert cards["ad1"]["root"] == str(adapters["ad1"][0])
    assert cards["ad1"]["object"] == "model"


def test_load_unload_while_streaming(server: Any, client: openai.OpenAI,
                                     adapters: dict) -> None:
    chunks: list[Any] = []
    errors: list[BaseException] = []
    started = threading.Event()

    def stream() -> None:
        try:
            for c in client.completions.create(model="ad1", prompt=PROMPT, max_tokens=48,
                                               temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
                chunks.append(c)
                started.set()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(120)
    r = post(server, "/v1/load_lora_adapter",
             {"lora_name": "ad2", "lora_path": str(adapters["ad2"][0])})
    assert r.status_code == 200, r.text
    assert r.text == "Success: LoRA adapter 'ad2' added successfully."
    assert complete(client, "ad2", 3).choices[0].text
    r = post(server, "/v1/unload_lora_adapter", {"lora_name": "ad1"})
    assert r.status_code == 200, r.text
    assert r.text == "Success: LoRA adapter 'ad1' removed successfully."
    t.join(180)
    assert not errors, errors
    assert chunks[-1].choices[0].finish_reason == "length"
    # The stream finished on ad1's weights: its text is the reference's.
    text, _ = reference_greedy(adapters["ad1"][1], 48)
    assert "".join(c.choices[0].text for c in chunks) == text
    with pytest.raises(openai.NotFoundError):
        complete(client, "ad1")
    ids = {c["id"] for c in httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]}
    assert "ad2" in ids and "ad1" not in ids
    # ad1's slot is free again now that nothing runs under it: a second adapter fits.
    r = post(server, "/v1/load_lora_adapter",
             {"lora_name": "ad3", "lora_path": str(adapters["ad3"][0])})
    assert r.status_code == 200, r.text


def test_error_bodies(server: Any, client: openai.OpenAI, adapters: dict,
                      tmp_path: Path) -> None:
    def err(path: str, body: dict, status: int) -> str:
        r = post(server, path, body)
        assert r.status_code == status, r.text
        e = r.json()["error"]
        assert e["code"] == status
        return e["message"]

    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    assert err(load, {"lora_name": "x"}, 400) == \
        "Both 'lora_name' and 'lora_path' must be provided."
    assert err(load, {"lora_name": MODEL, "lora_path": str(tmp_path)}, 400) == \
        f"The lora adapter '{MODEL}' conflicts with a served base model."
    if "ad2" not in {c["id"] for c in httpx.get(server.url + "/v1/models",
                                                  headers=AUTH).json()["data"]}:
        post(server, load, {"lora_name": "ad2", "lora_path": str(adapters["ad2"][0])})
    assert "has already been loaded" in err(
        load, {"lora_name": "ad2", "lora_path": str(adapters["ad2"][0])}, 400)
    missing = tmp_path / "nowhere"
    assert err(load, {"lora_name": "y", "lora_path": str(missing)}, 404) == \
        f"Loading lora y failed: No adapter found for {missing}"
    assert "rank 16 is greater than max_lora_rank 8" in err(
        load, {"lora_name": "big", "lora_path": str(adapters["big"][0])}, 400)
    assert "adapter_config.json" in err(load, {"lora_name": "z", "lora_path": str(tmp_path)},
                                        400)
    assert err(unload, {"lora_name": "nope"}, 404) == \
        "The lora adapter 'nope' cannot be found."
    assert err(unload, {}, 400) == "'lora_name' needs to be provided to unload a LoRA adapter."
    # Every slot taken (--max-loras 2): refused, not evicted under a running request.
    names = {c["id"] for c in httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]}
    for name in ("ad3", "ad1"):
        if name not in names and len(names - {MODEL}) < 2:
            post(server, load, {"lora_name": name, "lora_path": str(adapters[name][0])})
            names.add(name)
    assert "max-loras" in err(load, {"lora_name": "w", "lora_path": str(adapters["ad1"][0])},
                              409)
    # The key is needed; the server keeps serving.
    assert httpx.post(server.url + load, json={}).status_code == 401
    assert complete(client, MODEL, 2).choices[0].finish_reason == "length"


def test_flags_and_route_gating(monkeypatch: pytest.MonkeyPatch) -> None:
    from server.app import create_app
    from server.cli import parse_args
    from server.state import ServerState

    cfg = parse_args(["--enable-lora", "--max-loras", "3", "--max-lora-rank", "32",
                      "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}'])
    assert cfg.lora_modules == [("a", "/x"), ("b", "/y")]
    assert (cfg.engine.enable_lora, cfg.engine.max_loras, cfg.engine.max_lora_rank) == \
        (True, 3, 32)
    for bad in (["--lora-modules", "a=/x"], ["--enable-lora", "--lora-modules", "a"],
                ["--enable-lora", "--lora-modules", '{"name": "a"}'],
                ["--enable-lora", "--max-loras", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)

    def lora_routes(flags: list[str]) -> set[str]:
        app = create_app(ServerState(parse_args(flags)))
        return {r.rule for r in app.url_map.iter_rules() if "lora" in r.rule}

    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    assert lora_routes(["--enable-lora"]) == set()
    both = {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
    assert lora_routes(["--allow-runtime-lora-updating"]) == both
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    assert lora_routes([]) == both
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")
    assert lora_routes([]) == set()

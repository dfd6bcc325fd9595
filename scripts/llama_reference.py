"""Records llama.cpp's answers on a GGUF as test references (tests/data/llama_cpp_*.json).

    python scripts/llama_reference.py --llama-server PATH --model gemma-3-270m \
        --tokens tests/data/llama_cpp_tokens_gemma-3-270m.json \
        --completions tests/data/llama_cpp_completions_gemma-3-270m.json \
        [--llama-commit 0c1e57098]

llama-server (a binary built from llama.cpp, see bench_peers.py) is started on 127.0.0.1
and a free port with the model (a .gguf path or a named GGUF such as gemma-3-270m) and
asked two things:

- tokens: POST /tokenize for each text of TEXTS, once with add_special false and once true,
  parse_special true both times (special-token text is matched, as the tokenizers library
  does for added tokens). llama.cpp's tokenizer is the independent reference of
  actors/loader/gguf_tokenizer.py (tests/test_gguf_tokenizer.py).
- completions: POST /completion with each of PROMPTS as the raw prompt (llama-server adds
  BOS when the GGUF says so), temperature 0, n_predict 32, n_probs 2 (the top-2
  probabilities of the raw logits at each step, so a near-tie shows), no prompt cache. The
  reference of a model family's greedy decoding.

With --variant NAME (tests/gguf_variants.py) the model is a tiny random Llama carrying a
real model's tokenizer under another family's settings (Qwen 2's split, Llama 3's, Phi-3's
...), for the families without a GGUF at hand; only its tokens are worth recording.

Each file records the texts or prompts, the answers, the GGUF's name and sha256 (for a
variant: of the model whose tokenizer it carries), the request fields and the llama.cpp
commit given by --llama-commit (a build from a release tarball does not know its own).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from bench_peers import Peer  # noqa: E402
from server_under_test import free_port  # noqa: E402

# One text per kind of trouble for a tokenizer: scripts, byte fallback, whitespace runs,
# digits, special-token text, leading spaces.
TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces and trailing   ",
    "Grüße aus München! Übermäßig schöne Äpfel, Öl und Straßen.",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "こんにちは、世界！カタカナとひらがな、漢字も。",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ and a lone 🦙.",
    "def f(x):\n\tif x  >  1:\n\t\treturn x    *   2\n    return  0\n",
    "numbers 1234567890 3.14159 1,000,000 and 2024-12-05",
    "line one\n\nline three\n\n\n  indented\r\nwindows line",
    "<|im_start|>user\nhi<|im_end|> <start_of_turn>model\nok<end_of_turn><bos>",
    "Mixed: naïve café résumé — “quotes” ‘single’ … ½ ¼ µ ß ẞ",
    "Ελληνικά, русский текст, עברית, हिन्दी, 한국어, ไทย",
    "\t\ttabs\tinside\t\t",
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Die Hauptstadt von Deutschland ist",
    "1, 1, 2, 3, 5, 8, 13,",
]

COMPLETION_FIELDS = {"temperature": 0.0, "n_predict": 32, "n_probs": 2, "cache_prompt": False,
                     "return_tokens": True}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_path(name: str) -> Path:
    from actors.loader.default_model import GGUF_MODELS, named_gguf_path

    return named_gguf_path(name) if name in GGUF_MODELS else Path(name)


def tokens(url: str) -> list[dict]:
    out = []
    for text in TEXTS:
        row: dict = {"text": text}
        for key, add_special in (("ids", False), ("ids_add_special", True)):
            r = httpx.post(url + "/tokenize", json={"content": text, "add_special": add_special,
                                                     "parse_special": True}, timeout=60)
            r.raise_for_status()
            row[key] = r.json()["tokens"]
        out.append(row)
    return out


def completions(url: str) -> list[dict]:
    out = []
    for prompt in PROMPTS:
        r = httpx.post(url + "/completion", json={"prompt": prompt, **COMPLETION_FIELDS},
                       timeout=600)
        r.raise_for_status()
        body = r.json()
        steps = []
        for step in body["completion_probabilities"]:
            top = [{"id": t["id"], "token": t["token"], "logprob": t["logprob"]}
                   for t in step["top_logprobs"]]
            steps.append({"id": step["id"], "token": step["token"], "logprob": step["logprob"],
                          "top": top,
                          "margin": top[0]["logprob"] - top[1]["logprob"] if len(top) > 1
                          else math.inf})
        # the prompt as /completion tokenizes it (BOS as the file says, specials parsed)
        ids = httpx.post(url + "/tokenize", json={"content": prompt, "add_special": True,
                                                   "parse_special": True}, timeout=60)
        ids.raise_for_status()
        out.append({"prompt": prompt, "prompt_tokens": ids.json()["tokens"],
                    "tokens": body["tokens"], "text": body["content"],
                    "stop_type": body.get("stop_type"), "steps": steps})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", required=True, metavar="PATH")
    p.add_argument("--model", default=None, help="a .gguf file or a named GGUF")
    p.add_argument("--variant", default=None, help="a tokenizer variant (tests/gguf_variants.py)")
    p.add_argument("--tokens", type=Path, default=None, help="write the token references here")
    p.add_argument("--completions", type=Path, default=None,
                   help="write the greedy completions here")
    p.add_argument("--llama-commit", default="unknown", help="the llama.cpp commit built")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--llama-args", default="",
                   help="more llama-server flags, recorded (e.g. --no-repack: the repacked "
                   "CPU weights crashed the build used here at load)")
    args = p.parse_args()

    if (args.model is None) == (args.variant is None):
        p.error("name one of --model and --variant")
    tmp = tempfile.TemporaryDirectory()
    if args.variant:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests"))
        from gguf_variants import VARIANTS, source_path, write_variant

        args.model = VARIANTS[args.variant][0]
        gguf = write_variant(args.variant, Path(tmp.name) / f"{args.variant}.gguf",
                             tensors=True)
        of = source_path(args.model)
    else:
        gguf = of = model_path(args.model)
    port = free_port()
    server = Peer("llama-server", [args.llama_server, "-m", str(gguf), "--host", "127.0.0.1",
                                   "--port", str(port), "-t", str(args.threads), "-np", "1",
                                   "-c", "4096", "--no-webui", *shlex.split(args.llama_args)],
                  port)
    try:
        server.wait_ready()
        source = {"model": args.model, "variant": args.variant, "gguf": of.name,
                  "gguf_sha256": sha256(of),
                  "llama_cpp_commit": args.llama_commit,
                  "llama_server_args": args.llama_args}
        if args.tokens:
            doc = {"source": {**source, "endpoint": "POST /tokenize",
                              "request": {"content": "<text>", "parse_special": True,
                                          "add_special": "false for ids, true for "
                                                         "ids_add_special"}},
                   "texts": tokens(server.url)}
            args.tokens.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        if args.completions:
            doc = {"source": {**source, "endpoint": "POST /completion",
                              "request": {"prompt": "<raw prompt>", **COMPLETION_FIELDS}},
                   "completions": completions(server.url)}
            args.completions.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    finally:
        server.close()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

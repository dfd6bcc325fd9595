"""Request-level limits of `python -m server`: flags, body nesting, prompt size, templates,
vLLM's request checks, the tokenizer routes' bound, /metrics while loading, and logprob
rendering that keeps the event loop free.

    flags         every invalid value is refused by argparse (exit 2, no traceback)
    /metrics      200 while the model loads
    nesting       a body nested deeper than MAX_JSON_DEPTH is a 400 before any parsing
    prompt size   text longer than max_model_len x the longest token is a 400, untokenized
    templates     recursion / memory errors are 400s; replace / expandtabs / join / format
                  cannot build past the output cap
    vLLM checks   at most 4 stop strings, reasoning_effort in vLLM's set, text parts need text
    tokenizer     /tokenize and /detokenize: bounded queue (503 + Retry-After beyond it)
    logprobs      no event-loop step takes 100 ms of CPU while a large logprob response
                  is built (token texts are decoded and bodies built in worker threads)
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import BASE_ARGS, ServerProcess, default_tokenizer, free_port
from subproc import child_env

MODEL_LEN = 1024  # tests/server_helpers.BASE_ARGS
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def assert_envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    return err


# -- flags -------------------------------------------------------------------------------

BAD_FLAGS = [
    ["--dtype", "half"], ["--dtype", "float16"], ["--dtype", "int8"],
    ["--block-size", "0"], ["--block-size", "-16"], ["--block-size", "2048"],
    ["--max-queued-requests", "-1"], ["--max-num-seqs", "0"], ["--max-num-seqs", "-4"],
    ["--max-num-batched-tokens", "0"], ["--max-model-len", "0"], ["--max-model-len", "1"],
    ["--kv-cache-memory", "0"], ["--max-body-bytes", "0"],
    ["--port", "-1"], ["--port", "65536"], ["--max-logprobs", "-2"],
    ["--drain-timeout", "-1"], ["--drain-timeout", "nan"], ["--drain-timeout", "inf"],
    ["--seed", str(2**63)], ["--served-model-name", ""], ["--api-key", ""], ["--host", ""],
    ["--model", "/nonexistent/model.gguf"], ["--generation-config", "/nonexistent"],
    ["--chat-template", "neither a file nor a template"], ["--chat-template", "{% if %}"],
]


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=lambda a: " ".join(a))
def test_invalid_flag_values_are_refused_by_argparse(argv, capsys):
    from server.cli import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[0]}" in err and "Traceback" not in err, err


def test_valid_flag_values_still_parse():
    from actors.loader.dtype import DTYPE_CHOICES
    from server.cli import parse_args

    cfg = parse_args(["--dtype", "float", "--port", "0", "--max-logprobs", "-1",
                      "--max-queued-requests", "0", "--drain-timeout", "0", "--seed", "-5",
                      "--block-size", "1024", "--max-model-len", "2", "--generation-config",
                      "vllm", "--chat-template", "{{ messages[0]['content'] }}"])
    engine = cfg.engine
    assert (engine.dtype, cfg.port, engine.max_logprobs, engine.seed) == ("float32", 0, -1, -5)
    for name in DTYPE_CHOICES:
        assert parse_args(["--dtype", name]).engine.dtype == name


def test_invalid_flag_exits_2_before_loading_anything():
    for argv in (["--dtype", "half"], ["--block-size", "0"]):
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "server", "--port", "0", *argv],
                             capture_output=True, text=True, timeout=120, env=child_env(),
                             check=False)
        assert out.returncode == 2, (argv, out.stderr[-2000:])
        assert "error: argument" in out.stderr and "Traceback" not in out.stderr
        assert time.monotonic() - started < 30  # no model was loaded


# -- pure functions ----------------------------------------------------------------------

def test_json_nesting_depth_ignores_brackets_in_strings():
    from server.json_depth import nesting_depth

    cases = {b'{}': 1, b'[]': 1, b'1': 0, b'"[[["': 0, b'{"a": [1, {"b": "]]]}"}]}': 3,
             b'["\\"[", ["\\\\"], [[]]]': 3, b'{"k": "\\\\\\"{"}': 1,
             b'[' * 65 + b']' * 65: 65}
    for raw, depth in cases.items():
        assert nesting_depth(raw) == depth, raw


def test_token_texts_are_each_tokens_own_decoding():
    from actors.text.detokenizer import TokenTexts

    tok = default_tokenizer().backend_tokenizer
    vocab = tok.get_vocab_size()
    texts = TokenTexts(tok, vocab)
    ids = list(range(vocab))
    texts.fill(ids)
    assert all(texts[i] == tok.decode([i], skip_special_tokens=False) for i in ids)
    assert texts[vocab + 5] == tok.decode([vocab + 5], skip_special_tokens=False)


TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(["", "\t", "<a>"])


@settings(max_examples=300, deadline=None)
@given(s=TEXT, old=TEXT, new=TEXT, count=st.integers(-2, 5), tab=st.integers(-2, 12),
       items=st.lists(TEXT | st.integers(), max_size=6), value=st.recursive(
           st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
           lambda inner: st.lists(inner, max_size=4)
           | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12))
def test_template_size_bounds_are_never_below_the_result(s, old, new, count, tab, items, value):
    from jinja2.utils import htmlsafe_json_dumps
    from server.frontend import template_bounds as b

    assert b.replace_chars(s, old, new, count) >= len(s.replace(old, new, count))
    assert b.expandtabs_chars(s, tab) >= len(s.expandtabs(tab))
    strs = [x for x in items if isinstance(x, str)]
    assert b.join_chars(s, strs) >= len(s.join(strs))
    assert b.value_chars(value) >= len(str(value))
    assert b.value_chars(value, "r") >= len(repr(value))
    assert b.json_chars(value) >= len(htmlsafe_json_dumps(value))
    assert b.json_chars(value, 2) >= len(htmlsafe_json_dumps(value, indent=2))
    args = (value, s, tab)
    for fmt in ("{0}", "{0!r}:{1:>{2}}", "{1!a}{0}", "[{1:^7}]"):
        if tab >= 0:
            assert b.format_chars(fmt, args, {}) >= len(fmt.format(*args))
    for fmt, vals in (("%s|%r", (value, s)), ("%*s", (tab, s)), ("%(k)s", {"k": s})):
        assert b.percent_chars(fmt, vals) >= len(fmt % vals)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=300)
       | st.lists(st.sampled_from(["<|im_start|>", "\n" + " " * 80, "#" * 80, "é", "日本",
                                   "\U0001f600", " the", "\t", "\x06"]), min_size=1)
       .map("".join))
def test_prompt_char_bound_never_refuses_a_prompt_that_fits(text):
    """A text of n tokens is never refused by characters at max_model_len = n."""
    from actors.runtime.prompt_bounds import PromptCharBound

    tok = default_tokenizer().backend_tokenizer
    bound = PromptCharBound(tok)
    assert bound.applies and bound.max_token_chars == 81
    tokens = len(tok.encode(text, add_special_tokens=False).ids)
    assert bound.error(text, tokens) is None


def test_template_memory_error_is_a_400():
    from server.errors import APIError
    from server.frontend.chat_template import ChatRenderer

    class Huge:
        def __str__(self) -> str:
            raise MemoryError

    renderer = ChatRenderer(default_tokenizer(), template="{{ x }}")
    # The context value stands in for a template that asks for more memory than there is.
    render = renderer.prepare(HI, request_template=None, kwargs={"x": Huge()},
                              add_generation_prompt=True, continue_final_message=False)
    with pytest.raises(APIError) as exc:
        render()
    assert exc.value.status == 400


# -- the server --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    """One server; while it loads, /metrics is asked too (kept for the /metrics test)."""
    proc = ServerProcess("--trust-request-chat-template")
    proc.loading_metrics = []  # type: ignore[attr-defined]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.proc.poll() is None:
        try:
            if httpx.get(proc.url + "/health", timeout=2).status_code == 200:
                break
            r = httpx.get(proc.url + "/metrics", timeout=2)
            proc.loading_metrics.append((r.status_code, r.text))  # type: ignore[attr-defined]
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log()


def post(srv: ServerProcess, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=timeout)


@pytest.mark.slow
def test_metrics_answer_while_loading(srv):
    seen = srv.loading_metrics
    assert seen, "the server loaded before /metrics could be asked"
    assert all(status == 200 for status, _ in seen), seen[:3]
    assert any("llmserve_model_loading 1.0" in text for _, text in seen)


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.slow
def test_deeply_nested_bodies_are_400s(srv):
    from server.json_depth import MAX_JSON_DEPTH

    # chat_template_kwargs adds two levels (the body, the kwargs object).
    ok = post(srv, CHAT, {"messages": HI, "max_tokens": 1,
                          "chat_template_kwargs": {"x": nested(MAX_JSON_DEPTH - 2)}})
    assert ok.status_code == 200, ok.text
    err = assert_envelope(post(srv, CHAT, {"messages": HI, "max_tokens": 1,
                                           "chat_template_kwargs": {"x": nested(100)}}), 400)
    assert "nested" in err["message"]
    # Deep enough to overflow the template's tojson: refused before it reaches the template.
    deep = {"messages": HI, "max_tokens": 1, "chat_template": "{{ x|tojson }}",
            "chat_template_kwargs": {"x": nested(900)}}
    assert_envelope(post(srv, CHAT, deep), 400)


@pytest.mark.slow
def test_prompt_text_that_cannot_fit_is_refused_before_tokenizing(srv):
    big = "hello " * 600_000  # 3.6 MB
    for path, body in (("/v1/completions", {"prompt": big, "max_tokens": 1}),
                       ("/v1/completions", {"prompt": ["hi", big], "max_tokens": 1}),
                       (CHAT, {"messages": [{"role": "user", "content": big}],
                               "max_tokens": 1}),
                       ("/tokenize", {"prompt": big})):
        err = assert_envelope(post(srv, path, body), 400)
        # vLLM's first sentence; a chat prompt counts its rendered text.
        m = re.match(f"This model's maximum context length is {MODEL_LEN} tokens. However, "
                     r"your prompt contains (\d+) characters", err["message"])
        assert m and len(big) <= int(m.group(1)) < len(big) + 500 and err["param"] == "prompt"
    # Generous: the longest token, repeated to just under the context, is still served.
    tok = default_tokenizer()
    longest = max(tok.backend_tokenizer.get_vocab(), key=len)
    text = tok.convert_tokens_to_string([longest]) * (MODEL_LEN - 30)
    assert len(text) > 0.95 * MODEL_LEN * len(longest)
    r = post(srv, "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["prompt_tokens"] < MODEL_LEN


AMPLIFYING_TEMPLATES = [
    "{{ (('x' * 1000000).replace('', 'y' * 100))|length }}",
    "{{ (('x' * 1000000)|replace('', 'y' * 100))|length }}",
    "{{ (('x' * 1000).replace('x', 'y' * 100000))|length }}",
    "{{ (('\\t' * 100000).expandtabs(1000))|length }}",
    "{{ (('y' * 100000).join(['x'] * 1000))|length }}",
    "{{ (['x'] * 1000)|join('y' * 100000)|length }}",
    "{{ (('{0}' * 100000).format('y' * 1000))|length }}",
    "{{ (('{0:>4000000}' * 100).format(1))|length }}",
    "{{ (('%s' * 100000) % (('y' * 1000,) * 100000))|length }}",
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s|length }}"),
    "{{ (['x' * 4000000] * 4000000)|tojson|length }}",
    # Each string is within bounds; thousands of them are not (the render's memory cap).
    "{{ (range(100000)|map('center', 4000000)|list)|length }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
]


@pytest.mark.parametrize("template", AMPLIFYING_TEMPLATES)
@pytest.mark.slow
def test_template_amplification_and_recursion_are_400s(srv, template):
    err = assert_envelope(post(srv, CHAT, {"messages": HI, "max_tokens": 1,
                                           "chat_template": template}), 400)
    assert "chat template" in err["message"]


@pytest.mark.slow
def test_bounded_template_methods_still_work(srv):
    template = ("{{ 'a-b'.replace('-', '+') }}{{ '\\tx'.expandtabs(4) }}{{ ','.join(['p', 'q']) }}"
                "{{ '{0}{1}'.format('r', 's') }}{{ ['t', 'u']|join('.') }}{{ '%s!' % 'v' }}")
    r = post(srv, "/tokenize", {"messages": HI, "chat_template": template})
    assert r.status_code == 200, r.text
    assert default_tokenizer().decode(r.json()["tokens"]) == "a+b    xp,qrst.uv!"
    # Long numbers in content are content, not widths.
    template = ("{{ 'id 123456789 ok'|wordwrap(20) }}|{{ 'id 123456789 ok'|truncate(20) }}|"
                "{{ 'id 123456789'|replace('123456789', '#') }}|{{ '%s'|format('5551234567') }}")
    r = post(srv, "/tokenize", {"messages": HI, "chat_template": template})
    assert r.status_code == 200, r.text
    assert default_tokenizer().decode(r.json()["tokens"]) == \
        "id 123456789 ok|id 123456789 ok|id #|5551234567"


@pytest.mark.slow
def test_vllm_request_checks(srv):
    for path, base in (("/v1/completions", {"prompt": "hi"}), (CHAT, {"messages": HI})):
        body = dict(base, max_tokens=1)
        assert post(srv, path, dict(body, stop=["a", "b", "c", "d"])).status_code == 200
        err = assert_envelope(post(srv, path, dict(body, stop=["a", "b", "c", "d", "e"])), 400)
        assert "at most 4 stop strings" in err["message"] and err["param"] == "stop", err
    assert post(srv, CHAT, {"messages": HI, "max_tokens": 1,
                            "reasoning_effort": "low"}).status_code == 200
    err = assert_envelope(post(srv, CHAT, {"messages": HI, "max_tokens": 1,
                                           "reasoning_effort": "extreme"}), 400)
    assert err["param"] == "reasoning_effort" and "'minimal'" in err["message"], err
    for part in ({"type": "text"}, {"type": "text", "text": None}):
        err = assert_envelope(post(srv, CHAT, {"messages": [{"role": "user", "content": [part]}],
                                               "max_tokens": 1}), 400)
        assert err["param"] == "messages" and "text" in err["message"], err


def slow_template(turns: int) -> str:
    """A chat template whose render takes time in proportion to `turns` (x 1,000 loop turns)."""
    return (f"{{% for i in range({turns}) %}}{{% for j in range(1000) %}}{{% endfor %}}"
            "{% endfor %}{{ messages[0]['content'] }}")


def calibrated_slow_template(srv, seconds: float) -> str:
    """A template that renders in about `seconds` on this machine, now: machines differ by
    several times, and a fixed loop either renders too fast for requests to queue or runs
    into the render deadline."""
    turns = 20
    for _ in range(4):
        t0 = time.monotonic()
        r = post(srv, "/tokenize", {"messages": HI, "chat_template": slow_template(turns)})
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        if took >= 0.7 * seconds:
            break
        turns = int(turns * min(seconds / max(took, 1e-3), 50))
    return slow_template(turns)


@pytest.mark.slow
def test_tokenizer_routes_are_bounded(srv):
    from server.api.common.tokens import TOKENIZE_QUEUE, TOKENIZE_THREADS

    # ~0.4 s a render, measured alone: long enough for 30 requests that arrive together to
    # queue, and far from the 5 s render deadline even when the tokenizer threads share the
    # GIL and a busy machine slows each render several times (at 1 s, CI saw the deadline).
    template = calibrated_slow_template(srv, 0.4)
    count = TOKENIZE_THREADS + TOKENIZE_QUEUE + 12
    results: list[httpx.Response] = []
    go = threading.Barrier(count)

    def one() -> None:
        go.wait()
        results.append(post(srv, "/tokenize", {"messages": HI, "chat_template": template}))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert set(codes) == {200, 503}, codes
    assert codes.count(200) >= TOKENIZE_THREADS + TOKENIZE_QUEUE - 2, codes
    refused = next(r for r in results if r.status_code == 503)
    assert_envelope(refused, 503)
    assert refused.headers["Retry-After"]
    # Token-id input: the same bound as a token-id prompt, the context.
    assert post(srv, "/detokenize", {"tokens": [1] * MODEL_LEN}).status_code == 200
    assert_envelope(post(srv, "/detokenize", {"tokens": [1] * (MODEL_LEN + 1)}), 400)


class LongestStep(trio.abc.Instrument):
    """The most CPU time the event loop's thread spent in one task step (while `active`):
    how long that step kept every other task, /health and every stream waiting. CPU time,
    not wall time, so a busy machine does not inflate it."""

    def __init__(self, client: trio.lowlevel.Task) -> None:
        self.active, self.cpu, self.task = False, 0.0, ""
        self._client = client  # the test's own task, the HTTP client: not the server's
        self._start = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._start = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.thread_time() - self._start
        if self.active and spent > self.cpu and task is not self._client:
            self.cpu, self.task = spent, task.name


@pytest.mark.slow
async def test_logprob_responses_are_built_off_the_event_loop():
    """echo + logprobs=20 with n=16 over 8 prompts of ~100 tokens: each choice's logprobs
    repeat its prompt's, ~270k entries, and the prompt logprobs arrive in one engine output.
    A server in this process, so that a Trio instrument can time the event loop's steps."""
    from server.cli import parse_args
    from server.supervisor import Supervisor

    port = free_port()
    config = parse_args(["--port", str(port), *BASE_ARGS, "--log-level", "warning"])
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
             "kappa", "lambda", "mu"]
    prompts = [" ".join(words[(i + j) % len(words)] for j in range(80)) + f" {i}"
               for i in range(8)]
    body = {"prompt": prompts, "max_tokens": 1, "n": 16, "temperature": 1.0, "echo": True,
            "logprobs": 20}
    steps = LongestStep(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(Supervisor(config).run)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=900) as client:
                steps.active = True
                r = await client.post("/v1/completions", json=body)
                steps.active = False
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert r.status_code == 200, r.text[:300]
    choices = r.json()["choices"]
    positions = sum(len(c["logprobs"]["tokens"]) for c in choices)
    assert len(choices) == 128 and positions > 128 * 90
    assert all(len(c["prompt_logprobs"]) == len(c["logprobs"]["tokens"]) - 1 for c in choices)
    print(f"\n{positions} positions x 21 entries, {len(r.content) / 1e6:.0f} MB: longest "
          f"event-loop step {steps.cpu * 1000:.0f} ms of CPU ({steps.task})")
    assert steps.cpu < 0.1, (steps.cpu, steps.task)

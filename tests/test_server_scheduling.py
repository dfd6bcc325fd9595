"""`--scheduling-policy priority` and `cache_salt`, end to end on the real default model.

One server for the module, with one running sequence at a time so that requests queue.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from server_helpers import ServerProcess, metric

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
# About 150 tokens: nine full blocks of 16 can be prefix-cache hits.
LONG_PROMPT = ("A parcel left the depot on Monday, crossed two borders, waited at customs and "
               "reached the sorting centre on Thursday. ") * 6


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--scheduling-policy", "priority", "--max-num-seqs", "1",
                        "--enable-dev-endpoints").wait_ready()  # /server_info
    yield srv.url
    assert srv.stop() == 0, srv.log()


def gauge(url: str, name: str) -> float:
    value = metric(httpx.get(url + "/metrics").text, name, model_name=MODEL)
    assert value is not None, name
    return value


def wait_for(cond, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_policy_is_reported(server):
    cfg = httpx.get(server + "/server_info").json()["config"]
    assert cfg["engine"]["scheduling_policy"] == "priority"  # ServerConfig.engine


def test_waiting_requests_are_admitted_by_priority(server):
    """A long stream holds the only seat; "low" then "high" queue behind it. Once the stream
    ends, "high" (the lower value, although it arrived later) runs first."""
    finished: list[str] = []
    errors: list[BaseException] = []

    def complete(name: str, priority: int) -> None:
        try:
            r = httpx.post(server + "/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": f"Request {name}:", "max_tokens": 4,
                "temperature": 0, "ignore_eos": True, "priority": priority})
            assert r.status_code == 200, r.text
            finished.append(name)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    body = {"model": MODEL, "prompt": "Count:", "max_tokens": 900, "temperature": 0,
            "ignore_eos": True, "stream": True, "priority": 0}
    threads = []
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=120) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is running
        for i, (name, priority) in enumerate((("low", 10), ("high", -10))):
            t = threading.Thread(target=complete, args=(name, priority))
            t.start()
            threads.append(t)
            wait_for(lambda: gauge(server, "vllm:num_requests_waiting") == i + 1,
                     f"{name} to wait in the engine")
        assert gauge(server, "vllm:num_requests_running") == 1  # the stream still holds it
    # Closing the stream aborts it and frees the seat.
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert finished == ["high", "low"]


def cached_tokens_of(url: str, salt: str | None) -> int:
    """Prefix-cache hit tokens of one request (the server's counters, before and after)."""
    before_q = gauge(url, "vllm:prefix_cache_queries_total")
    before_h = gauge(url, "vllm:prefix_cache_hits_total")
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    queried = r.json()["usage"]["prompt_tokens"] - 1
    wait_for(lambda: gauge(url, "vllm:prefix_cache_queries_total") - before_q >= queried,
             "the prefix-cache counters")
    return int(gauge(url, "vllm:prefix_cache_hits_total") - before_h)


def test_cache_salt_separates_prefix_cache(server):
    first = cached_tokens_of(server, "tenant-a")
    other = cached_tokens_of(server, "tenant-b")
    same = cached_tokens_of(server, "tenant-a")
    unsalted = cached_tokens_of(server, None)
    unsalted_again = cached_tokens_of(server, None)
    assert (first, other, unsalted) == (0, 0, 0)
    assert same >= 128 and unsalted_again == same


@pytest.mark.parametrize(("salt", "needle"), [
    ("", "must be a non-empty string"),
    ("s" * 129, "at most 128 characters"),
    ("tenant/a", "must not contain '@', '/'"),
    ("tenant\na", "printable characters only"),
])
def test_bad_cache_salt_is_400(server, salt, needle):
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "cache_salt": salt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == "cache_salt"


def test_the_priority_header_sets_a_request_priority(plain_server):
    """X-Vllm-Priority, as vLLM 0.34 reads it: an integer header overrides the body's
    priority (chat, completions, Responses); a header that is not an integer is ignored.
    The default server schedules first come first served, so a priority other than 0
    from the header is refused as one from the body is."""
    url = plain_server.url
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    cmpl = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", cmpl),
                       ("/v1/responses", {"model": MODEL, "input": "Hi",
                                          "max_output_tokens": 16})):
        r = httpx.post(url + path, json=body, headers={"X-Vllm-Priority": "5"}, timeout=60)
        assert r.status_code == 400, (path, r.text)
        assert "Got priority 5 but Priority scheduling is not enabled." in r.text, r.text
        for ignored in ("0", "high"):
            r = httpx.post(url + path, json=body, headers={"X-Vllm-Priority": ignored},
                           timeout=60)
            assert r.status_code == 200, (path, ignored, r.text)
    # The header wins over the body's value.
    r = httpx.post(url + "/v1/completions", json={**cmpl, "priority": 3},
                   headers={"X-Vllm-Priority": "0"}, timeout=60)
    assert r.status_code == 200, r.text

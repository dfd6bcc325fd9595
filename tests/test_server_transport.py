"""The HTTP transport of `python -m server` over raw sockets: no connection can take the
server down, framing that could smuggle a request is refused, every transport error is the
JSON envelope, open connections and the output held for slow readers are capped.

One server for the module, with small caps. The stall timeout is long (300 s), so every
slow-reader drop seen here is the buffer cap's doing.
"""

from __future__ import annotations

import random
import select
import socket
import struct
import time

import h11
import httpx
import orjson
import pytest

from server_helpers import ServerProcess, metric

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
MAX_CONNECTIONS = 12
MAX_BUFFERED = 64 * 1024
MAX_TOTAL_BUFFERED = 128 * 1024
ENVELOPE_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server_proc():
    srv = ServerProcess("--max-connections", str(MAX_CONNECTIONS),
                        "--max-buffered-bytes", str(MAX_BUFFERED),
                        "--max-total-buffered-bytes", str(MAX_TOTAL_BUFFERED),
                        env={"LLMSERVE_STALL_TIMEOUT": "300"}).wait_ready()
    yield srv
    log = srv.log()  # (stop closes it)
    assert srv.stop() == 0, log


# -- raw HTTP/1.1 ------------------------------------------------------------------------

def connect(srv: ServerProcess, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", srv.port))
    return s


def read_all(s: socket.socket, timeout: float = 10) -> tuple[bytes, bool]:
    """Everything until the server closes (True) or `timeout` passes (False)."""
    got = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            piece = s.recv(65536)
        except TimeoutError:
            return got, False
        except ConnectionResetError:
            return got, True
        if not piece:
            return got, True
        got += piece
    return got, False


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """(status, headers, body) of each complete response in `data`."""
    conn = h11.Connection(h11.CLIENT)
    if data:  # (b"" would tell h11 the connection closed)
        conn.receive_data(data)
    out: list[tuple[int, dict[str, str], bytes]] = []
    while True:  # one request cycle per response; the requests are only for h11's state
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        status, headers, body = 0, {}, b""
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append((status, headers, body))
                break
            else:  # NEED_DATA, ConnectionClosed: nothing more complete
                return out
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return out
        conn.start_next_cycle()


def exchange(srv: ServerProcess, payload: bytes,
             timeout: float = 10) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Send `payload` on a new connection; the responses and whether the server closed."""
    with connect(srv) as s:
        s.sendall(payload)
        data, closed = read_all(s, timeout)
    return responses(data), closed


def check_envelope(status: int, headers: dict[str, str], body: bytes, want: int) -> None:
    assert status == want, (status, headers, body[:300])
    assert headers.get("content-type") == "application/json", headers
    err = orjson.loads(body)["error"]
    assert set(err) == ENVELOPE_KEYS and err["code"] == want, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)


def request(method: str, path: str, headers: list[str] | None = None, body: bytes = b"",
            content_type: str | None = "application/json") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines += headers if headers is not None else [f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def serves(srv: ServerProcess) -> None:
    """The server answers a normal request on a new connection."""
    r = httpx.post(srv.url + "/tokenize", json={"prompt": "Hello"}, timeout=30)
    assert r.status_code == 200 and r.json()["count"] >= 1, r.text


def wait_idle(srv: ServerProcess, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(srv.url + "/metrics").text
        running = metric(text, "vllm:num_requests_running", model_name=MODEL)
        waiting = metric(text, "vllm:num_requests_waiting", model_name=MODEL)
        load = httpx.get(srv.url + "/load").json()["server_load"]
        if running == 0 and waiting == 0 and load == 0:
            return
        assert time.monotonic() < deadline, (running, waiting, load)
        time.sleep(0.05)


def aborted(srv: ServerProcess) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return metric(text, "vllm:request_success_total", model_name=MODEL,
                  finished_reason="abort") or 0.0


# -- the connection cap (first: no other connection is open yet) --------------------------

def test_connections_beyond_the_cap_get_503_and_the_rest_are_served(server_proc):
    time.sleep(0.5)  # the readiness probes' connections have closed
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(connect(server_proc))
            time.sleep(0.05)  # accepted in order
        readable, _, _ = select.select(held, [], [], 0.3)
        assert not readable  # nobody inside the cap was refused
        with connect(server_proc) as extra:
            extra.sendall(request("GET", "/health", headers=[]))
            data, closed = read_all(extra)
        assert closed
        [(status, headers, body)] = responses(data)
        check_envelope(status, headers, body, 503)
        assert headers.get("retry-after") == "1" and headers.get("connection") == "close"
        # The connections inside the cap are still served while it is full.
        held[0].sendall(request("GET", "/health", headers=[]))
        held[0].settimeout(10)
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 5
    while True:  # the closed connections leave the count promptly
        try:
            serves(server_proc)
            break
        except (AssertionError, httpx.HTTPError):
            assert time.monotonic() < deadline, "connections stayed counted after closing"
            time.sleep(0.05)


# -- one connection's failure stays in that connection -----------------------------------

def test_bad_chunk_terminators_racing_responses_never_escape_the_connection(server_proc):
    """A chunked body whose chunk ends in b"XX" instead of CRLF, arriving while the app
    answers (404 without reading the body): Hypercorn's error response and the app's close
    race for the socket (trio.BusyResourceError), which used to end the process. Hundreds
    of tries at random offsets: the server must live, log no traceback, and serve."""
    head = request("POST", "/no/such/route", headers=["Transfer-Encoding: chunked"])
    rng = random.Random(0)
    started = time.monotonic()
    for i in range(600):
        if time.monotonic() - started > 60:
            break
        try:
            s = connect(server_proc)
        except OSError as exc:
            pytest.fail(f"the server stopped accepting after {i} tries: {exc}\n"
                        f"{server_proc.log()}")
        with s:
            s.sendall(head)
            pause = rng.random() * 0.003
            until = time.perf_counter() + pause
            while time.perf_counter() < until:
                pass
            try:
                s.sendall(b"2\r\n{}XX0\r\n\r\n")
                s.settimeout(5)
                s.recv(65536)
            except OSError:
                pass
    assert server_proc.proc.poll() is None, server_proc.log()
    log = server_proc.log(tail=None)
    assert "Traceback" not in log and "Error in ASGI" not in log, log[-6000:]
    serves(server_proc)


def test_connection_level_errors_never_leave_their_connection(server_proc):
    """Each malformed or cut-off exchange ends on its own connection; a normal request on a
    new connection is served after every one."""
    json_head = ["Content-Length: 40"]
    malformed = [
        b"GARBAGE\r\n\r\n",
        b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nno-colon\r\n\r\n",
        b"GET /health HTTP/1.1\r\n folded\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
        request("POST", "/tokenize", headers=["Transfer-Encoding: chunked"]) + b"zz\r\n",
        request("POST", "/tokenize", headers=["Transfer-Encoding: chunked"])
        + b"3\r\nabcXX",
        request("POST", "/tokenize", headers=["Content-Length: 99999999999999999999999"]),
        request("POST", "/tokenize", headers=["Content-Length: -1"]),
        bytes.fromhex("16030100a5010000a10303") + bytes(100),  # a TLS ClientHello
    ]
    for payload in malformed:
        got, closed = exchange(server_proc, payload)
        assert closed, payload
        [(status, headers, body)] = got
        check_envelope(status, headers, body, 400)
        serves(server_proc)

    # Cut off: mid-head, mid-body, by a reset, by a half-close, with nothing sent at all.
    cut = [
        (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Le", "close"),
        (request("POST", "/tokenize", headers=json_head) + b'{"prompt": "a', "close"),
        (request("POST", "/tokenize", headers=json_head) + b'{"prompt": "a', "reset"),
        (request("POST", "/tokenize", headers=["Transfer-Encoding: chunked"]) + b"5\r\n{\"pr",
         "reset"),
        (request("POST", "/v1/completions", body=orjson.dumps(
            {"prompt": "Hi", "max_tokens": 400, "ignore_eos": True})), "half-close"),
        (b"", "close"),
        (b"", "reset"),
    ]
    aborts = aborted(server_proc)
    for payload, how in cut:
        s = connect(server_proc)
        s.sendall(payload)
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif how == "half-close":
            s.shutdown(socket.SHUT_WR)
            _, closed = read_all(s, 30)
            assert closed, "a half-closed connection was left open"
        s.close()
        serves(server_proc)

    # Reset in the middle of a streamed response: the request is aborted, KV freed.
    with connect(server_proc) as s:
        s.sendall(request("POST", "/v1/completions", body=orjson.dumps(
            {"prompt": "Tell me a story.", "max_tokens": 800, "ignore_eos": True,
             "stream": True})))
        seen = b""
        while seen.count(b"data: ") < 3:
            piece = s.recv(65536)
            assert piece, seen
            seen += piece
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_idle(server_proc)
    assert aborted(server_proc) >= aborts + 1  # the stream (and the half-closed request)
    assert server_proc.proc.poll() is None
    assert "Traceback" not in server_proc.log(tail=None), server_proc.log()
    serves(server_proc)


# -- a client that leaves as its response starts -------------------------------------------

def _stream_request(i: int) -> bytes:
    if i % 2:
        body = {"prompt": f"Story {i}:"}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": f"Story {i}:"}]}
        path = "/v1/chat/completions"
    body.update(stream=True, max_tokens=400, ignore_eos=True)
    return request("POST", path, body=orjson.dumps(body))


def _reset(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_clients_reset_as_the_headers_come_back_leave_nothing_running(server_proc):
    """A reset that reaches the server after the request was admitted but before its SSE
    body was first iterated (while the response head is written) used to leave the request
    registered and generating for nobody. Resets are swept across the time the head takes
    to come back, so some land in that window on any machine."""
    wait_idle(server_proc)
    heads = []
    for i in range(5):
        with connect(server_proc) as s:
            started = time.perf_counter()
            s.sendall(_stream_request(i))
            assert select.select([s], [], [], 10)[0]
            heads.append(time.perf_counter() - started)
            _reset(s)
    head = sorted(heads)[2]
    steps = 40
    for i in range(160):
        s = connect(server_proc)
        s.sendall(_stream_request(i))
        time.sleep(head * 1.25 * (i % steps) / steps)
        _reset(s)
    wait_idle(server_proc, timeout=3)
    serves(server_proc)


# -- framing that could smuggle a request -------------------------------------------------

SMUGGLED = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("framing", [
    ["Content-Length: 5", "Transfer-Encoding: chunked"],
    ["Transfer-Encoding: chunked", "Content-Length: 5"],
    ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
    ["Transfer-Encoding: chunked", "Transfer-Encoding: identity"],
    ["Transfer-Encoding: chunked, chunked"],
    ["Transfer-Encoding: gzip, chunked"],
])
def test_ambiguous_framing_is_refused_and_nothing_after_it_is_answered(server_proc, framing):
    payload = request("POST", "/tokenize", headers=framing) + b"0\r\n\r\n" + SMUGGLED
    got, closed = exchange(server_proc, payload)
    assert closed
    assert len(got) == 1, got  # the pipelined request behind the body is never answered
    check_envelope(*got[0], 400)
    serves(server_proc)


def test_plain_chunked_and_pipelined_requests_still_work(server_proc):
    body = b'{"prompt": "Hello"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    payload = (request("POST", "/tokenize", headers=["Transfer-Encoding: chunked"]) + chunked
               + request("POST", "/tokenize", body=body) + SMUGGLED)
    with connect(server_proc) as s:
        s.sendall(payload)
        data = b""
        while len(responses(data)) < 3:
            piece = s.recv(65536)
            assert piece, data
            data += piece
    got = responses(data)
    assert [status for status, _, _ in got] == [200, 200, 200]
    assert orjson.loads(got[0][2])["tokens"] == orjson.loads(got[1][2])["tokens"]


# -- header limits -------------------------------------------------------------------------

def test_more_than_100_headers_get_431(server_proc):
    def with_headers(n: int) -> bytes:  # n headers in all, Host and Connection included
        extra = [f"X-H{i}: v" for i in range(n - 2)]
        return request("GET", "/health", headers=["Connection: close", *extra],
                       content_type=None)

    got, _ = exchange(server_proc, with_headers(100))
    assert [status for status, _, _ in got] == [200]
    got, closed = exchange(server_proc, with_headers(101))
    assert closed and len(got) == 1
    check_envelope(*got[0], 431)
    big = request("GET", "/health", headers=[f"X-Big: {'a' * 70000}"], content_type=None)
    got, closed = exchange(server_proc, big)
    assert closed and len(got) == 1
    check_envelope(*got[0], 431)
    serves(server_proc)


# -- JSON routes need a JSON body ----------------------------------------------------------

def test_json_routes_refuse_other_or_missing_content_types(server_proc):
    body = orjson.dumps({"prompt": "Hello", "max_tokens": 1})
    for path in ("/tokenize", "/v1/completions"):
        for ctype in (None, "text/plain", "application/x-www-form-urlencoded",
                      "application/vnd.api+json", ""):
            headers = {} if ctype is None else {"Content-Type": ctype}
            r = httpx.post(server_proc.url + path, content=body, headers=headers, timeout=30)
            check_envelope(r.status_code, dict(r.headers), r.content, 400)
            assert "Content-Type" in r.json()["error"]["message"]
        r = httpx.post(server_proc.url + path, content=body, timeout=30,
                       headers={"Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text


# -- every transport error is the envelope -------------------------------------------------

def test_every_transport_error_is_the_json_envelope(server_proc):
    cases = [
        (b"GET  HTTP/1.1\r\n\r\n", 400),
        (request("GET", "/no/such/route", headers=["Connection: close"]), 404),
        (request("DELETE", "/v1/completions", headers=["Connection: close"]), 405),
        (request("BREW", "/v1/models", headers=["Connection: close"]), 405),
        (request("POST", "/v1/completions", headers=["Content-Length: 99999999"]), 413),
        (request("GET", "/health", headers=[f"X-H{i}: v" for i in range(150)]), 431),
        (request("POST", "/v1/completions", headers=["Transfer-Encoding: chunked"] * 2), 400),
    ]
    for payload, want in cases:
        got, closed = exchange(server_proc, payload)
        assert closed and len(got) == 1, (payload[:80], got)
        check_envelope(*got[0], want)


def test_responses_that_end_the_connection_close_it(server_proc):
    """HTTP/1.0, Connection: close, and a 413 whose body is still on the wire: the server
    closes the connection after the response instead of waiting for the client to."""
    cases = [
        (b"GET /health HTTP/1.0\r\n\r\n", 200),
        (request("GET", "/health", headers=["Connection: close"], content_type=None), 200),
        (request("POST", "/tokenize", headers=["Content-Length: 99999999"]) + b"{" * 1000,
         413),
    ]
    for payload, want in cases:
        started = time.monotonic()
        got, closed = exchange(server_proc, payload, timeout=5)
        assert closed and time.monotonic() - started < 2, (payload[:60], got)
        assert [status for status, _, _ in got] == [want]


# -- answers that come before the body has arrived ------------------------------------------

EARLY = [("POST", "/v1/nothere", 404), ("POST", "/health", 405)]


def test_pooled_client_never_meets_a_connection_closed_after_an_early_answer(server_proc):
    """404 and 405 answer before a 200 KB body has arrived; a pooled client reusing the
    connection must never find it closed without having been told."""
    body = b'{"prompt": "' + b"x" * 200_000 + b'"}'
    failures: list[str] = []
    with httpx.Client(base_url=server_proc.url, timeout=30) as c:
        for i in range(200):
            method, path, want = EARLY[i % len(EARLY)]
            try:
                r = c.request(method, path, content=body,
                              headers={"Content-Type": "application/json"})
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            assert r.status_code == want, r.text[:300]
    assert not failures, (len(failures), failures[:3])
    serves(server_proc)


def test_a_body_answered_early_is_read_and_the_connection_kept(server_proc):
    """The rest of a body of known, bounded length is read and dropped after the early
    answer, and the next request on the connection is served."""
    body = b"x" * 300_000
    with connect(server_proc) as s:
        s.sendall(request("POST", "/v1/nothere", headers=[f"Content-Length: {len(body)}"]))
        got = b""
        while b"\r\n\r\n" not in got:  # the answer comes before the body is sent
            piece = s.recv(65536)
            assert piece, got
            got += piece
        assert b"connection: close" not in got.lower(), got
        for i in range(0, len(body), 50_000):
            s.sendall(body[i:i + 50_000])
            time.sleep(0.01)
        s.sendall(request("GET", "/health", content_type=None))
        data, closed = read_all(s, timeout=2)
    got = responses(got + data)
    assert [status for status, _, _ in got] == [404, 200] and not closed, got


@pytest.mark.parametrize("framing", ["large", "chunked"])
def test_an_early_answer_that_ends_the_connection_says_so(server_proc, framing):
    """A body too large to read and drop, or of unknown length: the early answer carries
    `Connection: close`, and the server closes."""
    if framing == "large":
        head = request("POST", "/v1/nothere", headers=["Content-Length: 3000000"])
    else:
        head = request("POST", "/v1/nothere", headers=["Transfer-Encoding: chunked"])
    with connect(server_proc) as s:
        s.sendall(head + (b"x" * 1000 if framing == "large" else b"3e8\r\n" + b"x" * 1000))
        data, closed = read_all(s, timeout=5)
    got = responses(data)
    assert [status for status, _, _ in got] == [404] and closed, (data[:300], closed)
    assert got[0][1].get("connection") == "close", got[0][1]


# -- output held for slow readers ----------------------------------------------------------

def _open_stream(srv: ServerProcess, logprobs: int | None) -> socket.socket:
    """A long streaming request whose client never reads."""
    s = connect(srv, rcvbuf=4096)
    s.sendall(request("POST", "/v1/completions", body=orjson.dumps(
        {"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True,
         "stream": True, "logprobs": logprobs})))
    return s


def _wait_aborts(srv: ServerProcess, want: float, timeout: float) -> float:
    started = time.monotonic()
    while aborted(srv) < want:
        assert time.monotonic() - started < timeout, (
            f"the slow readers were not dropped\n{srv.log()[-3000:]}")
        time.sleep(0.2)
    return time.monotonic() - started


def _check_dropped(s: socket.socket) -> None:
    """The connection was reset before the stream could end."""
    got, closed = read_all(s, 10)
    assert closed and b"data: [DONE]" not in got and b'"finish_reason":"length"' not in got


def test_slow_reader_over_its_buffer_cap_is_dropped(server_proc):
    aborts = aborted(server_proc)
    with _open_stream(server_proc, logprobs=5) as s:  # ~1 KB a token
        took = _wait_aborts(server_proc, aborts + 1, 40)
        _check_dropped(s)
    # 1000 tokens take far longer than the ~100 that hold 64 KiB; the stall timeout is 300.
    assert took < 30
    assert "--max-buffered-bytes " in server_proc.log(tail=None)
    wait_idle(server_proc)
    serves(server_proc)


def test_slow_readers_over_the_total_cap_are_dropped_largest_first(server_proc):
    """Eight streams that never read, each far under its own cap when together they pass
    the total: the total cap drops the largest, one by one, while the rest do not fit; the
    dropped ones are aborted, and engine capacity comes back."""
    def total_drops() -> int:
        return server_proc.log(tail=None).count("--max-total-buffered-bytes ")

    before, aborts = total_drops(), aborted(server_proc)
    streams = [_open_stream(server_proc, logprobs=None) for _ in range(8)]
    try:
        started = time.monotonic()
        while total_drops() < before + 3:
            assert time.monotonic() - started < 60, server_proc.log()[-3000:]
            time.sleep(0.2)
        _wait_aborts(server_proc, aborts + 3, 10)
        dropped = 0
        for s in streams:
            got, closed = read_all(s, 1)
            if closed:
                assert b"data: [DONE]" not in got
                dropped += 1
        assert dropped >= 3
    finally:
        for s in streams:
            s.close()
    wait_idle(server_proc, 30)
    serves(server_proc)

"""Property-based requests generated from the server's own /openapi.json (schemathesis).

schemathesis fuzzes every operation with a fixed number of generated requests (its coverage
phase, boundary values of every field, spends minutes on each generation route, far past
what CI can give the whole suite; the routes' own tests cover their bounds). No response may
be a 5xx and no request may go unanswered (a read timeout is an error); afterwards the
server must answer a greedy canary exactly as before and exit 0 on SIGTERM. The server runs
with a short context and few seats so that any generated max_tokens or n stays quick.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess
from subproc import child_env

schemathesis = pytest.importorskip("schemathesis")

pytestmark = pytest.mark.slow

EXAMPLES = 12  # generated requests per operation
RUN_TIMEOUT_S = 600  # the whole run, a guard only: it ends by count
REQUEST_TIMEOUT_S = 10  # generations are at most --max-model-len tokens: well under this
CANARY = {"prompt": [1, 2, 3, 4], "max_tokens": 8, "temperature": 0.0}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--max-model-len", "40", "--max-num-seqs", "8")
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"server exit code {code}"


def canary(server: ServerProcess) -> str:
    r = httpx.post(server.url + "/v1/completions", json=CANARY, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_openapi_document_loads_and_every_ref_resolves(server: ServerProcess) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    refs = set(_refs(doc))
    assert refs, "the request bodies refer to their models"
    for ref in refs:
        assert ref.startswith("#/"), ref
        target: Any = doc
        for part in ref[2:].split("/"):
            assert isinstance(target, dict) and part in target, f"unresolvable {ref}"
            target = target[part]
    loaded = schemathesis.openapi.from_dict(doc)
    ops = {f"{op.method.upper()} {op.path}": op
           for op in (r.ok() for r in loaded.get_all_operations())}
    for name in ("POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize",
                 "POST /detokenize", "POST /invocations", "GET /metrics", "GET /health"):
        assert name in ops, name
    assert ops["POST /v1/completions"].body, "the completions body schema was not loaded"


def test_generated_requests_get_no_5xx_and_always_an_answer(server: ServerProcess,
                                                              tmp_path: Path) -> None:
    before = canary(server)
    report = tmp_path / "schemathesis.json"
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", server.url + "/openapi.json",
           "--checks", "not_a_server_error", "--phases", "fuzzing",
           "--max-examples", str(EXAMPLES), "--workers", "1",
           "--seed", "1", "--request-timeout", str(REQUEST_TIMEOUT_S), "--no-color",
           "--report", "json", "--report-json-path", str(report)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=child_env(),
                          cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    out = json.loads(report.read_text())
    summary = done.stdout[-6000:]
    assert out["failures"] == [] and out["errors"] == [], summary
    assert out["test_cases"]["with_failures"] == 0 and out["test_cases"]["errored"] == 0, summary
    assert out["warnings"]["unresolvable_reference"] == [], out["warnings"]
    assert out["operations"]["tested"] == out["operations"]["selected"] >= 15, out["operations"]
    assert out["test_cases"]["generated"] >= 5 * out["operations"]["selected"], out["test_cases"]
    assert done.returncode == 0, summary
    # Alive and unchanged: the same greedy output, and healthy.
    assert server.proc.poll() is None, server.log()
    assert canary(server) == before
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200

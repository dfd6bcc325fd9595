"""`python -m server` as a subprocess with the real default model, for the server tests.

Each test module starts one server (module-scoped fixture) on a free port and stops it with
SIGTERM at the end. The server's stderr goes to a temporary file, not a pipe: nothing has to
drain it while tests run, and it is closed (no unclosed-file warnings) when the server stops.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from subproc import child_env

ROOT = Path(__file__).resolve().parents[1]
# Small enough to start fast and to keep KV memory low; every server test uses these. None
# changes a request's numbers (tests/test_batch_invariance.py checks): the servers run the
# default, batch-invariant mode, so a request's tokens do not depend on the batch it shared
# and a server's outputs equal offline_llm()'s to the bit.
BASE_ARGS = ("--max-model-len", "1024", "--kv-cache-memory", "256m", "--drain-timeout", "20")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `python -m server` child process."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()
        # Its own state directory (the Responses API's store): never the user's, and never
        # one that another test server opens at the same time.
        self._state = tempfile.TemporaryDirectory(prefix="llmserve-state-")
        full_env = child_env(**{"LLMSERVE_STATE_DIR": self._state.name, **(env or {})})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--port", str(self.port), *BASE_ARGS, *args],
            env=full_env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
        )
        self.health_codes: list[int] = []  # /health answers seen while waiting for ready

    def wait_ready(self, timeout: float = 240) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                code = httpx.get(self.url + "/health", timeout=2).status_code
                self.health_codes.append(code)
                if code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def log(self, tail: int | None = 6000) -> str:
        """The server's output so far: its last `tail` characters, or all of it (None)."""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        return text if tail is None else text[-tail:]

    def send_signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal (if still running), wait, close the log; returns the exit code."""
        try:
            self.send_signal(signum)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        finally:
            self._log.close()
            self._state.cleanup()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition (labels must all match)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r"([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def sse_data(lines: Any) -> list[str]:
    """The data payloads of an SSE stream's lines."""
    return [line[6:] for line in lines if line.startswith("data: ")]


_offline: Any = None


def offline_llm() -> Any:
    """The offline engine (actors.LLM) on the default model, built once per test process with
    the same engine settings the test servers use."""
    global _offline
    if _offline is None:
        from actors import LLM

        _offline = LLM(max_model_len=1024, kv_cache_memory=64 << 20, num_threads=1,
                       quantization="auto", linear_routing=False)
    return _offline


def offline_greedy(prompt_token_ids: list[int], max_tokens: int) -> tuple[list[int], str]:
    """(token ids, text) the offline engine generates greedily for a token-id prompt."""
    from actors import SamplingParams

    llm = offline_llm()
    out = llm.generate([prompt_token_ids], SamplingParams(max_tokens=max_tokens,
                                                          temperature=0.0))[0].outputs[0]
    return out.token_ids, out.text


_tokenizer: Any = None


def default_tokenizer() -> Any:
    """The default model's tokenizer, from the same converted directory the engine loads."""
    global _tokenizer
    if _tokenizer is None:
        from transformers import AutoTokenizer

        from actors.loader import prepare_model_dir

        _tokenizer = AutoTokenizer.from_pretrained(str(prepare_model_dir(None)[1]))
    return _tokenizer


def engine_children(pid: int) -> list[int]:
    """The server's engine-core processes (multiprocessing spawn children)."""
    kids = []
    # a child is listed under the thread that forked it
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    found = []
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    found.append(k)
        except FileNotFoundError:
            pass
    return found

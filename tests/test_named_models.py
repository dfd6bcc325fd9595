"""GGUF models served by name (--model gemma-3-270m): resolved to the file their packages
assemble, served under the name the user passed, and a missing package is one line naming
the pip command (exit 2 from the server, as any model it cannot serve)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from actors.loader.default_model import GGUF_MODELS, DefaultModelMissing, named_gguf_path
from server_helpers import BASE_ARGS, free_port
from subproc import child_env

GEMMA = "gemma-3-270m"
GEMMA_PACKAGE = GGUF_MODELS[GEMMA][0]


def gemma_path() -> Path:
    try:
        return named_gguf_path(GEMMA)
    except DefaultModelMissing as exc:
        pytest.skip(f"the gemma3 extra is not installed: {exc}")


def test_gemma_resolves_to_its_assembled_gguf() -> None:
    path = gemma_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 200 << 20
    assert named_gguf_path(GEMMA) == path  # the second call finds the file it made
    from actors.loader.gguf_tokenizer import read_metadata

    assert read_metadata(path)["general.architecture"] == "gemma3"


def fake_package(root: Path, name: str, body: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


def test_a_missing_package_names_the_pip_command(tmp_path, monkeypatch) -> None:
    # the main package imports its chunk packages when it assembles, as gemma's does
    fake_package(tmp_path, "chunked_model_main",
                 "from importlib import import_module\n"
                 "def assemble():\n    import_module('chunked_model_part_xyz')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(GGUF_MODELS, "no-such", ("no_such_model_package_xyz", "pip install a"))
    monkeypatch.setitem(GGUF_MODELS, "chunked", ("chunked_model_main", "pip install b c"))
    with pytest.raises(DefaultModelMissing,
                       match=r"'no_such_model_package_xyz'.*install it with: pip install a$"):
        named_gguf_path("no-such")
    with pytest.raises(DefaultModelMissing,
                       match=r"'chunked_model_part_xyz'.*install it with: pip install b c$"):
        named_gguf_path("chunked")


def test_the_cli_serves_a_named_gguf_under_its_name() -> None:
    from actors.loader.dtype import resolve_quantization
    from server.cli import parse_args

    cfg = parse_args(["--model", GEMMA])  # accepted before anything is assembled
    assert cfg.engine.model == GEMMA and cfg.served_model_names == [GEMMA]
    # a named GGUF is a GGUF: --quantization auto keeps its blocks as for a .gguf path
    assert resolve_quantization("auto", GEMMA, "bfloat16") == "gguf"
    assert parse_args(["--model", GEMMA, "--served-model-name", "g"]).served_model_names == ["g"]


def test_an_unknown_name_lists_the_named_models(capsys) -> None:
    from server.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", "gemma-3-27b"])
    err = capsys.readouterr().err
    assert "does not exist" in err and GEMMA in err and "whisper-base" in err


def test_the_server_refuses_a_named_model_without_its_package_in_one_line(tmp_path) -> None:
    # The package hidden from this one process, whether or not it is installed.
    code = ("import runpy, sys\n"
            f"sys.modules[{GEMMA_PACKAGE!r}] = None\n"
            "sys.argv = ['server', *sys.argv[1:]]\n"
            "runpy.run_module('server', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run(
        [sys.executable, "-c", code, "--port", str(free_port()), *BASE_ARGS, "--model", GEMMA],
        env=child_env(LLMSERVE_STATE_DIR=str(tmp_path / "state")), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr[-3000:]
    assert f"cannot serve {GEMMA}" in errors[0] and GGUF_MODELS[GEMMA][1] in errors[0], errors
    assert "Traceback" not in done.stderr


def test_gemma_is_served_by_name() -> None:
    """The whole path: /v1/models shows the name passed, /v1/completions serves, chat is refused as vLLM does (a base model: no
    template)."""
    gemma_path()
    import httpx

    from server.frontend.chat_template import NO_TEMPLATE_MESSAGE
    from server_helpers import ServerProcess

    srv = ServerProcess("--model", GEMMA).wait_ready(timeout=900)
    try:
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == [GEMMA]
        r = httpx.post(srv.url + "/v1/completions", timeout=120, json={
            "model": GEMMA, "prompt": "The capital of France is", "max_tokens": 4,
            "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "model": GEMMA, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == NO_TEMPLATE_MESSAGE
    finally:
        log = srv.log()
        assert srv.stop() == 0, log

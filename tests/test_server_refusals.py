"""A model the server cannot serve is refused at load time with one line and exit code 2,
as a refused flag is: an unsupported architecture (GGUF or Hugging Face), a directory that
is no model, a malformed GGUF file, an adapter of --lora-modules that cannot load. No
traceback: tracebacks are for bugs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from server_helpers import BASE_ARGS, free_port
from subproc import child_env


def tiny_gguf(path: Path, arch: str) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run_server(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", "--port", str(free_port()), *BASE_ARGS, *args],
        env=child_env(LLMSERVE_STATE_DIR=str(tmp_path / "state")), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=240)


def models(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (arguments, words the one error line must hold)"""
    hf = tmp_path / "gpt2"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    empty = tmp_path / "empty"
    empty.mkdir()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    return {
        "gguf architecture": (["--model", str(tiny_gguf(tmp_path / "g.gguf", "mamba"))],
                              ["'mamba'", "not supported", "supported: gemma2", "llama", "qwen3moe"]),
        "hf architecture": (["--model", str(hf)], ["'gpt2'", "not supported", "llama"]),
        "no config.json": (["--model", str(empty)], ["config.json"]),
        "malformed gguf": (["--model", str(junk)], ["GGUF"]),
    }


@pytest.mark.parametrize("case", ["gguf architecture", "hf architecture", "no config.json",
                                  "malformed gguf"])
def test_a_model_that_cannot_be_served_exits_2_with_one_line(tmp_path, case):
    args, words = models(tmp_path)[case]
    done = run_server(tmp_path, *args)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "cannot serve" in errors[0] and all(w in errors[0] for w in words), errors
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    assert len(done.stderr.splitlines()) < 15, done.stderr


def test_a_lora_module_that_cannot_load_exits_2(tmp_path, default_model_path):
    missing = tmp_path / "no-such-adapter"
    done = run_server(tmp_path, "--enable-lora", "--lora-modules", f"a={missing}")
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "--lora-modules a=" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr

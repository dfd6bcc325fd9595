"""The command line of `python -m server`: --help, and how flags become the one EngineConfig.

    --help     every flag documented with its default; the engine flags show EngineConfig's
               own defaults (no copy to drift); no torch or transformers is imported
    engine     the engine flags land in ServerConfig.engine, the object the engine is built
               from, and nowhere else
    metadata   the parser is the config fields' flag metadata: each declared range and
               choice is what the parser enforces, and no flags means every field's default
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from actors.config import EngineConfig
from subproc import child_env

# Engine settings the server's command line sets; the rest (num_threads, extra) keep the
# engine's defaults.
ENGINE_FLAGS = {"model": "--model", "dtype": "--dtype", "max_model_len": "--max-model-len",
                "max_num_seqs": "--max-num-seqs",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "block_size": "--block-size", "kv_cache_memory": "--kv-cache-memory",
                "kv_cache_dtype": "--kv-cache-dtype",
                "enable_prefix_caching": "--enable-prefix-caching", "seed": "--seed",
                "scheduling_policy": "--scheduling-policy",
                "generation_config": "--generation-config", "max_logprobs": "--max-logprobs"}


def help_blocks() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "server", "--help"], capture_output=True,
                         text=True, timeout=60, check=True, env=child_env()).stdout
    blocks = {}
    for block in out.split("\n  -")[1:]:
        blocks["-" + block.split()[0].rstrip(",")] = " ".join(block.split())
    return blocks


def test_help_documents_every_flag_with_its_default():
    from server.cli import build_parser

    blocks = help_blocks()
    for action in build_parser()._actions:
        if action.option_strings == ["-h", "--help"]:
            continue
        block = blocks.get(action.option_strings[0])
        assert block is not None, action.option_strings
        assert "default" in block.lower(), block


def test_help_shows_the_engine_config_defaults():
    blocks = help_blocks()
    defaults = EngineConfig()
    shown = {"max_num_seqs": f"(default: {defaults.max_num_seqs})",
             "max_num_batched_tokens": f"(default: {defaults.max_num_batched_tokens})",
             "block_size": f"(default: {defaults.block_size})",
             "kv_cache_memory": f"Default: {defaults.kv_cache_memory >> 30}g",
             "kv_cache_dtype": f"(default: {defaults.kv_cache_dtype})",
             "enable_prefix_caching": f"(default: {defaults.enable_prefix_caching})",
             "scheduling_policy": f"(default: {defaults.scheduling_policy})",
             "dtype": f"(default: {defaults.dtype})",
             "generation_config": f"Default: {defaults.generation_config}",
             "max_logprobs": f"(default: {defaults.max_logprobs})"}
    for name, text in shown.items():
        assert text in blocks[ENGINE_FLAGS[name]], (name, blocks[ENGINE_FLAGS[name]])


def test_help_imports_no_engine_libraries():
    code = ("import sys, contextlib, io\n"
            "from server.cli import parse_args\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    parse_args(['--help'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'numpy', 'llmcore', 'trio')"
            " if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=child_env())


def test_engine_flags_fill_server_config_engine():
    from server.cli import parse_args
    from server.config import ServerConfig

    assert not {f.name for f in dataclasses.fields(ServerConfig)} & set(ENGINE_FLAGS), \
        "an engine setting is copied into ServerConfig"
    cfg = parse_args([])
    assert isinstance(cfg.engine, EngineConfig)
    # The server seeds with 0 by default (as `vllm serve`) and resolves --quantization auto
    # (the default model keeps its GGUF blocks where its weights would be bf16); every
    # other default is the engine's.
    from actors.loader.dtype import resolve_quantization

    assert cfg.engine == dataclasses.replace(
        EngineConfig(), seed=0, quantization=resolve_quantization("auto", None, "auto"))
    cfg = parse_args(["--dtype", "float", "--max-model-len", "8k", "--max-num-seqs", "3",
                      "--max-num-batched-tokens", "512", "--block-size", "32",
                      "--kv-cache-memory", "512m", "--kv-cache-dtype", "bfloat16",
                      "--no-enable-prefix-caching", "--seed", "-5",
                      "--scheduling-policy", "priority", "--generation-config", "vllm",
                      "--max-logprobs", "-1"])
    assert cfg.engine == EngineConfig(
        dtype="float32", max_model_len=8000, max_num_seqs=3, max_num_batched_tokens=512,
        block_size=32, kv_cache_memory=512 << 20, kv_cache_dtype="bfloat16",
        enable_prefix_caching=False, seed=-5, scheduling_policy="priority",
        generation_config="vllm", max_logprobs=-1)


def flagged() -> list:
    from server.config import ServerConfig
    from server.flag_parser import flagged_fields

    return list(flagged_fields(ServerConfig))


def test_no_flags_give_every_fields_own_default():
    from actors.config import AdmissionWindow
    from server.cli import parse_args
    from server.config import ServerConfig

    cfg, defaults = parse_args([]), ServerConfig()
    # resolved by the command line: the name a model is served by, the store's file
    resolved = {"engine", "served_model_names", "responses_store"}
    for f in dataclasses.fields(ServerConfig):
        if f.name not in resolved:
            assert getattr(cfg, f.name) == getattr(defaults, f.name), f.name
    assert cfg.admission_window == AdmissionWindow()  # 50 ms and 1.5 ms, in seconds


def test_each_declared_range_is_what_the_parser_enforces(capsys):
    from server.cli import parse_args
    from server.flag_parser import VALUE_TYPES

    # flags that only mean something beside another (parse_args refuses them alone)
    beside = {"--elastic-ep-max-dp-size": ["--enable-elastic-ep"]}
    checked = 0
    for f, (spec, *_) in flagged():
        name = spec.name or "--" + f.name.replace("_", "-")
        for bound, outside in ((spec.low, -1), (spec.high, 1)):
            if bound is None:
                continue
            assert parse_args([*beside.get(name, []), name, str(bound)]) is not None
            with pytest.raises(SystemExit) as exc:
                parse_args([*beside.get(name, []), name, str(bound + outside)])
            assert exc.value.code == 2
            assert f"argument {name}" in capsys.readouterr().err
            checked += 1
        assert spec.type is None or spec.type in VALUE_TYPES, (f.name, spec.type)
    assert checked >= 20


def test_each_declared_choice_is_accepted_and_no_other(capsys):
    from server.cli import parse_args

    def value(cfg, name):
        return getattr(cfg.engine, name) if hasattr(cfg.engine, name) else getattr(cfg, name)

    for f, (spec, *_) in flagged():
        if spec.choices is None:
            continue
        name = spec.name or "--" + f.name.replace("_", "-")
        for word in spec.choices:
            expected = spec.choices[word] if isinstance(spec.choices, dict) else word
            if f.name == "quantization":  # resolved against the (default) model
                from actors.loader.dtype import resolve_quantization

                expected = resolve_quantization(word, None, "auto")
            assert value(parse_args([name, word]), f.name) == expected, (name, word)
        with pytest.raises(SystemExit):
            parse_args([name, "no-such-choice"])
        assert "invalid choice" in capsys.readouterr().err


def test_an_unusable_responses_store_is_refused_at_start(tmp_path, capsys):
    from server.cli import parse_args

    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad, why in ((tmp_path, "is a directory"), (blocker / "r.sqlite", "not a directory")):
        with pytest.raises(SystemExit):
            parse_args(["--responses-store", str(bad)])
        assert why in capsys.readouterr().err
    fine = tmp_path / "new" / "dir" / "r.sqlite"
    assert parse_args(["--responses-store", str(fine)]).responses_store == fine
    assert not fine.parent.exists()  # nothing made before the server runs


@pytest.mark.parametrize("case", ["in use", "unknown host"])
def test_a_port_it_cannot_listen_on_is_one_line_and_exit_1_before_the_model_loads(case):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        host = "127.0.0.1" if case == "in use" else "no-such-host.invalid"
        out = subprocess.run([sys.executable, "-m", "server", "--host", host, "--port",
                              str(port)], capture_output=True, text=True, timeout=120,
                             env=child_env())
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"cannot listen on {host}:{port}" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "loading the engine" not in out.stderr


@pytest.mark.parametrize("flag, text, want", [
    ("--max-model-len", "2048", 2048),
    ("--max-model-len", "8k", 8000),        # decimal suffixes, as vLLM reads them
    ("--max-model-len", "25.6k", 25600),
    ("--max-model-len", "8K", 8192),        # binary suffixes
    ("--max-model-len", "auto", None),      # the model's own length
    ("--max-model-len", "-1", None),
    ("--max-num-batched-tokens", "1m", 1_000_000),
    ("--max-num-queued-tokens", "2K", 2048),
])
def test_token_counts_read_as_vllm_reads_them(flag: str, text: str, want: int | None) -> None:
    from server.cli import parse_args

    cfg = parse_args([flag, text])
    got = {"--max-model-len": cfg.engine.max_model_len,
           "--max-num-batched-tokens": cfg.engine.max_num_batched_tokens,
           "--max-num-queued-tokens": cfg.max_num_queued_tokens}[flag]
    assert got == want


@pytest.mark.parametrize("text, message", [
    ("1.5K", "Decimals are not allowed with binary suffixes like K"),
    ("12x", "not a token count"),
    ("1", "must be at least 2"),
])
def test_bad_token_counts_are_usage_errors(text: str, message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "server", "--max-model-len", text],
                          capture_output=True, text=True, env=child_env(), timeout=60,
                          check=False)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-500:]

"""generation_config.json as request defaults: read once (actors.params.defaults), used the
same by the server and the offline LLM.

    mapping   vLLM's nine sampling keys, renamed to SamplingParams fields; absent and null
              keys give no default; do_sample=false keeps them; auto / vllm / a directory
    served    a server started with --generation-config DIR applies every default a request
              leaves unset (presence_penalty included, which an earlier server-side map
              could never receive), exactly as the offline LLM applies them
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from actors.params.defaults import GenerationDefaults, load_generation_defaults


def write(folder: Path, **raw: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(raw))
    return folder


def test_the_nine_keys_become_sampling_params_fields(tmp_path: Path) -> None:
    folder = write(tmp_path / "m", do_sample=False, temperature=0.6, top_p=0.9, top_k=50,
                   min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
                   frequency_penalty=-0.5, max_new_tokens=100, skip_special_tokens=False,
                   eos_token_id=2, max_length=4096, typical_p=None, num_beams=1)
    got = load_generation_defaults(folder, "auto")
    assert dict(got) == {"temperature": 0.6, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
                         "repetition_penalty": 1.1, "presence_penalty": 0.5,
                         "frequency_penalty": -0.5, "max_tokens": 100,
                         "skip_special_tokens": False}
    assert load_generation_defaults(tmp_path / "elsewhere", str(folder)) == got


def test_null_and_absent_keys_give_no_default(tmp_path: Path) -> None:
    folder = write(tmp_path, temperature=None, top_k=0, bos_token_id=1)
    assert dict(load_generation_defaults(folder, "auto")) == {"top_k": 0}


def test_auto_vllm_and_a_directory(tmp_path: Path) -> None:
    folder = write(tmp_path / "m", temperature=0.3)
    assert load_generation_defaults(folder, "vllm") == GenerationDefaults()
    assert len(load_generation_defaults(tmp_path / "no-file", "auto")) == 0
    with pytest.raises(FileNotFoundError):
        load_generation_defaults(folder, str(tmp_path / "no-file"))


@pytest.mark.slow
def test_server_and_offline_apply_the_same_defaults(tmp_path: Path) -> None:
    from actors import LLM, SamplingParams
    from server_helpers import ServerProcess, default_tokenizer

    # Greedy, and a presence penalty strong enough to change what a repetitive prompt
    # continues with: if the penalty did not arrive, the text would differ.
    folder = write(tmp_path / "gen", temperature=0.0, presence_penalty=2.0, max_new_tokens=6)
    prompt = default_tokenizer()("one two one two one two one two one two",
                                 add_special_tokens=False)["input_ids"]
    llm = LLM(max_model_len=1024, kv_cache_memory=64 << 20, num_threads=1,
              generation_config=str(folder))
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.presence_penalty, defaults.max_tokens) == \
        (0.0, 2.0, 6)
    want = llm.generate([prompt], defaults)[0].outputs[0]
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))[0]
    assert plain.outputs[0].token_ids != want.token_ids, "the penalty changes nothing here"

    srv = ServerProcess("--generation-config", str(folder)).wait_ready()
    try:
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 6})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want.text
        # A request's own value wins over the default.
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 6, "presence_penalty": 0.0})
        assert r.json()["choices"][0]["text"] == plain.outputs[0].text
        # Chat leaves max_tokens unset: max_new_tokens is its cap. (Completions' own
        # default, 16, is the protocol's, as in vLLM.)
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Count to twenty."}], "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
    finally:
        assert srv.stop() == 0, srv.log()

"""server.frontend.transcription, the seam the audio routes call, on a real in-process server
serving --model whisper-tiny.en (one Supervisor for the module, driven without HTTP except
where the routes themselves are the point).

Windows decode through the generation service with the engine's batching; the special
tokens and the prompt follow the model (English-only: no language or task tokens); a
window's deltas end with its finish reason and never carry <|endoftext|>; a consumer that
leaves early aborts its window; features of the wrong shape are a 400 naming the field;
the server mounts no generation route.
"""

from __future__ import annotations

import re
from contextlib import aclosing
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio

pytest.importorskip("faster_whisper")
import soundfile as sf  # noqa: E402
from server_helpers import free_port  # noqa: E402

from actors.params.sampling import SamplingParams  # noqa: E402
from server.errors import APIError  # noqa: E402
from server.frontend import transcription as tr  # noqa: E402

AUDIO = Path(__file__).parent / "data" / "audio"
GREEDY = SamplingParams(temperature=0.0, max_tokens=None)


def features(clip: str) -> np.ndarray:
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.feature_extractor import FeatureExtractor

    audio, _ = sf.read(AUDIO / f"whisper_{clip}.wav", dtype="float32")
    return pad_or_trim(FeatureExtractor(feature_size=80)(audio)).astype(np.float32)


def words(s: str) -> list[str]:
    return re.findall(r"[\w']+", s.lower())


async def test_seam_on_a_whisper_server(llmserve_cache_dir):
    from actors.loader import DefaultModelMissing
    from actors.loader.whisper import resolve_named
    from server.cli import parse_args
    from server.supervisor import Supervisor

    try:
        resolve_named("whisper-tiny.en")
    except DefaultModelMissing as exc:
        pytest.skip(str(exc))
    port = free_port()
    config = parse_args(["--port", str(port), "--model", "whisper-tiny.en",
                         "--max-model-len", "1024", "--kv-cache-memory", "64m",
                         "--log-level", "warning"])
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(Supervisor(config).run)
        try:
            await _checks(sup.srv, f"http://127.0.0.1:{port}")
        finally:
            nursery.cancel_scope.cancel()


async def _checks(srv, url: str) -> None:
    toks = tr.whisper_tokens(srv)
    assert (toks.sot, toks.eot, toks.notimestamps, toks.timestamp_begin) == (
        50257, 50256, 50362, 50363)
    assert not toks.multilingual and toks.n_mels == 80
    assert toks.prompt() == [50257, 50362]
    assert toks.prompt(timestamps=True, previous=[11, 12]) == [toks.sot_prev, 11, 12, 50257]
    with pytest.raises(APIError) as err:
        toks.prompt(task="translate")
    assert err.value.status == 400 and err.value.param == "task"
    assert (await tr.language_detect(srv, features("numbers"))).code == "en"

    # two windows at once, each streamed: the engine batches them
    got: dict[str, list[tr.WindowDelta]] = {}

    async def window(clip: str) -> None:
        async with aclosing(tr.transcribe_window(srv, clip, features(clip), toks.prompt(),
                                                 GREEDY)) as deltas:
            got[clip] = [d async for d in deltas]

    async with trio.open_nursery() as n:
        for clip in ("numbers", "fox"):
            n.start_soon(window, clip)
    for clip, deltas in got.items():
        assert deltas[-1].finish_reason == "stop"
        assert all(d.finish_reason is None for d in deltas[:-1]) and len(deltas) > 1
        ids = [t for d in deltas for t in d.token_ids]
        assert toks.eot not in ids and all(t < toks.eot for t in ids)
        assert "".join(d.text for d in deltas) == srv.tokenizer.decode(
            ids, skip_special_tokens=True)
    spoken = (AUDIO / "whisper_numbers.txt").read_text()
    assert words("".join(d.text for d in got["numbers"])) == words(spoken)

    # leaving after the first delta aborts the window; everything is handed back
    async with aclosing(tr.transcribe_window(srv, "early", features("fox"), toks.prompt(),
                                             GREEDY)) as deltas:
        async for _ in deltas:
            break
    with trio.fail_after(10):
        while len(srv.registry) or srv.admission.in_use:
            await trio.sleep(0.01)

    for bad in (np.zeros((80, 100), np.float32), np.zeros((80, 3000), np.float64)):
        with pytest.raises(APIError) as err:
            await tr.transcribe_window(srv, "bad", bad, toks.prompt(), GREEDY).__anext__()
        assert err.value.status == 400 and err.value.param == "file"

    async with httpx.AsyncClient(base_url=url) as client:
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["whisper-tiny.en"]
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            r = await client.post(route, json={"model": "whisper-tiny.en", "prompt": "hi"})
            assert r.status_code == 404, route  # not mounted, as vLLM for Whisper

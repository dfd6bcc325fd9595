"""Speech to text: our Whisper server against faster-whisper, same weights, same run.

A ~60 s English clip is made in a temp dir by concatenating the committed English clips
(tests/data/audio, 0.5 s of silence between, repeated), its reference text from the .txt
files beside them. Ours goes through a real `python -m server --model M` on a free port and
/v1/audio/transcriptions (httpx multipart, greedy, language given, json: no timestamps);
faster-whisper 1.2.1 runs in-process on the same CTranslate2 weights (beam 1, no
timestamps, cpu_threads = the CPU count the server uses). Measured: real-time factor
(seconds of processing / seconds of audio) per side and dtype (ours float32 and bf16,
CTranslate2 float32 and int8), medians over alternated rounds; 8 concurrent requests'
throughput (audio seconds per wall second) against ours versus faster-whisper doing the
same 8 one after another (it has no batching server); word error rate of each transcript.
Ratios are against faster-whisper float32 measured in the same run. JSON on stdout,
progress on stderr.

    python scripts/bench_whisper.py [--model whisper-base|whisper-tiny.en] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT / "tests" / "data" / "audio"
ENGLISH = ("whisper_fox", "en_coffee", "whisper_weather", "en_paris", "whisper_numbers")
SR = 16000


def log(msg: str) -> None:
    print(f"[bench_whisper] {msg}", file=sys.stderr, flush=True)


def word_error_rate(ref: str, hyp: str) -> float:
    """(substitutions + deletions + insertions) / reference words, lower-cased, no punctuation."""
    r, h = (re.findall(r"[\w']+", s.lower()) for s in (ref, hyp))
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / len(r)


def make_clip(seconds: float, out: Path) -> tuple[Path, float, str]:
    """(wav path, duration, reference text): the English clips cycled until `seconds`."""
    import soundfile as sf

    gap = np.zeros(SR // 2, dtype=np.float32)
    pieces, texts, total = [], [], 0.0
    while total < seconds:
        for name in ENGLISH:
            audio, sr = sf.read(AUDIO / f"{name}.wav", dtype="float32")
            assert sr == SR
            pieces += [audio, gap]
            texts.append((AUDIO / f"{name}.txt").read_text().strip())
            total += (len(audio) + len(gap)) / SR
            if total >= seconds:
                break
    wav = np.concatenate(pieces)
    sf.write(out, wav, SR)
    return out, len(wav) / SR, " ".join(texts)


def ct2_dir(model: str, out: Path) -> Path:
    """A CTranslate2 directory faster-whisper opens: the joined model.bin of our cache and
    the package's own config and tokenizer files."""
    from actors.loader import prepare_model_dir
    from actors.loader.whisper import resolve_named

    src = resolve_named(model)[0]
    _, entry, _ = prepare_model_dir(model)
    out.mkdir()
    (out / "model.bin").symlink_to(Path(entry, "model.bin").resolve())
    for f in ("config.json", "tokenizer.json", "vocabulary.txt", "preprocessor_config.json"):
        if (src / f).exists():
            (out / f).symlink_to(src / f)
    return out


class Server:
    """One `python -m server --model M --dtype D` on a free port."""

    def __init__(self, model: str, dtype: str) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.logf = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--model", model, "--dtype", dtype,
             "--port", str(self.port), "--kv-cache-memory", "512m"],
            env=env, stdin=subprocess.DEVNULL, stdout=self.logf, stderr=self.logf)

    def wait_ready(self, timeout: float = 600) -> Server:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.logf.seek(0)
                raise RuntimeError(f"server exited:\n{self.logf.read()[-4000:].decode()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ours(server: Server, model: str, wav: Path) -> str:
    import httpx

    r = httpx.post(server.url + "/v1/audio/transcriptions", timeout=900,
                   files={"file": ("clip.wav", wav.read_bytes(), "audio/wav")},
                   data={"model": model, "language": "en", "temperature": "0",
                         "response_format": "json"})
    r.raise_for_status()
    return r.json()["text"]


def faster(wm: Any, wav: Path) -> str:
    segments, _ = wm.transcribe(str(wav), language="en", beam_size=1, temperature=0.0,
                                without_timestamps=True, condition_on_previous_text=False,
                                vad_filter=False)
    return " ".join(s.text.strip() for s in segments)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="whisper-base", choices=("whisper-base", "whisper-tiny.en"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, a ~20 s clip")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--note", default=None, help="free text recorded in the JSON")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    threads = os.cpu_count() or 1

    import faster_whisper
    import llmcore
    from faster_whisper import WhisperModel

    tmp = Path(tempfile.mkdtemp(prefix="bench-whisper-"))
    wav, duration, ref = make_clip(20.0 if args.quick else 60.0, tmp / "clip.wav")
    log(f"clip {duration:.1f} s of audio")
    src = ct2_dir(args.model, tmp / "ct2")

    # Ours: one server per dtype, in turn (one model process at a time).
    sides: dict[str, dict[str, Any]] = {}
    for dtype, name in (("float32", "ours_float32"), ("bfloat16", "ours_bf16")):
        log(f"starting the server ({dtype})")
        server = Server(args.model, dtype).wait_ready()
        try:
            ours(server, args.model, wav)  # warm
            dts, text = [], ""
            for r in range(rounds):
                dt, text = timed(lambda: ours(server, args.model, wav))
                dts.append(dt)
                log(f"{name} round {r + 1}/{rounds}: RTF {dt / duration:.3f}")
            wall, texts = timed(lambda: list(ThreadPoolExecutor(args.concurrency).map(
                lambda _: ours(server, args.model, wav), range(args.concurrency))))
            log(f"{name} {args.concurrency} concurrent: {wall:.1f} s")
        finally:
            server.stop()
        sides[name] = {"rtf_median": round(statistics.median(dts) / duration, 4),
                       "rtf_rounds": [round(d / duration, 4) for d in dts],
                       "wer": round(word_error_rate(ref, text), 4),
                       "concurrent_wer_max": round(max(word_error_rate(ref, t) for t in texts), 4),
                       "concurrent_audio_s_per_s": round(args.concurrency * duration / wall, 3)}

    # faster-whisper in-process; compute types alternated per round.
    models = {ct: WhisperModel(str(src), device="cpu", compute_type=ct, cpu_threads=threads)
              for ct in ("float32", "int8")}
    fw: dict[str, list[float]] = {ct: [] for ct in models}
    fw_text: dict[str, str] = {}
    for ct, wm in models.items():
        faster(wm, wav)  # warm
    for r in range(rounds):
        for ct in (list(models) if r % 2 == 0 else list(models)[::-1]):
            dt, fw_text[ct] = timed(lambda: faster(models[ct], wav))
            fw[ct].append(dt)
            log(f"faster-whisper {ct} round {r + 1}/{rounds}: RTF {dt / duration:.3f}")
    for ct, wm in models.items():
        wall, texts = timed(lambda: [faster(wm, wav) for _ in range(args.concurrency)])
        sides[f"faster_whisper_{ct}"] = {
            "rtf_median": round(statistics.median(fw[ct]) / duration, 4),
            "rtf_rounds": [round(d / duration, 4) for d in fw[ct]],
            "wer": round(word_error_rate(ref, fw_text[ct]), 4),
            "sequential_audio_s_per_s": round(args.concurrency * duration / wall, 3)}
        log(f"faster-whisper {ct} {args.concurrency} sequential: {wall:.1f} s")

    base = sides["faster_whisper_float32"]
    ratios = {f"{k}_speed_vs_faster_whisper_float32": round(base["rtf_median"] / v["rtf_median"], 3)
              for k, v in sides.items() if k != "faster_whisper_float32"}
    for k in ("ours_float32", "ours_bf16"):
        ratios[f"{k}_{args.concurrency}_concurrent_vs_faster_whisper_float32_sequential"] = round(
            sides[k]["concurrent_audio_s_per_s"] / base["sequential_audio_s_per_s"], 3)
    doc = {
        "benchmark": "speech to text: real-time factor and throughput, ours vs faster-whisper",
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "isa": llmcore.linear_isa(), "cpu_count": threads},
        "note": args.note,
        "model": args.model,
        "faster_whisper": faster_whisper.__version__,
        "clip_seconds": round(duration, 2),
        "rounds": rounds,
        "concurrency": args.concurrency,
        "decoding": "greedy, language en, no timestamps; ours over HTTP (json), "
                    f"faster-whisper in-process, cpu_threads={threads}",
        "sides": sides,
        "ratios": ratios,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

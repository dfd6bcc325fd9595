"""The on-disk cache of converted checkpoints.

    $LLMSERVE_CACHE_DIR (default ~/.cache/llmserve)/
      gguf/
        <stem>-<key>/          a complete HF-style directory, never partially written
        .tmp-<stem>-<random>/  a conversion in progress (renamed into place when done)

The key hashes the source file's identity (absolute path, size, mtime_ns) and the
converter version: editing or replacing the file, or changing the converter, gives a new
entry. Directories appear atomically by rename, so a reader sees a whole entry or none,
and two processes converting at once both succeed (the loser's copy is discarded).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "LLMSERVE_CACHE_DIR"
_COMPLETE_MARKER = "source.json"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "llmserve"


def source_identity(path: Path) -> dict[str, object]:
    p = path.resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cache_key(path: Path, version: int) -> str:
    ident = {**source_identity(path), "converter_version": version}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_entry(path: Path, version: int, kind: str = "gguf") -> Path:
    return cache_root() / kind / f"{path.stem}-{cache_key(path, version)}"


def is_complete(entry: Path) -> bool:
    return (entry / _COMPLETE_MARKER).is_file()


def get_or_create(
    path: Path, version: int, build: Callable[[Path], None], kind: str = "gguf"
) -> tuple[Path, bool]:
    """Returns (entry directory, hit). On a miss ``build(tmp_dir)`` fills a temporary
    directory that is then renamed into place."""
    entry = cache_entry(path, version, kind)
    if is_complete(entry):
        return entry, True
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.stem}-", dir=entry.parent))
    try:
        build(tmp)
        ident = {**source_identity(path), "converter_version": version}
        (tmp / _COMPLETE_MARKER).write_text(json.dumps(ident, indent=2) + "\n")
        if entry.exists() and not is_complete(entry):
            shutil.rmtree(entry)  # left by a crash of an older, non-atomic writer
        try:
            os.rename(tmp, entry)
        except OSError:
            if not is_complete(entry):
                raise
            shutil.rmtree(tmp)  # another process finished first; its copy is equivalent
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry, False

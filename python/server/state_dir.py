"""Where the server keeps what outlives a process (the Responses API's store): standard
library only, since the command line reads it before anything heavy is imported."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "LLMSERVE_STATE_DIR"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$LLMSERVE_STATE_DIR, else $XDG_STATE_HOME/llmserve (~/.local/state/llmserve)."""
    env = os.environ if environ is None else environ
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV])
    xdg = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "llmserve"


def default_responses_store(environ: Mapping[str, str] | None = None) -> Path:
    return state_dir(environ) / "responses.sqlite"


def make_private_dirs(path: Path) -> None:
    """Makes the folder `path` and its missing parents, each one made here mode 0700 (the
    umask notwithstanding); a folder that was already there is left as it is."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process: its mode is its own
            continue
        os.chmod(folder, 0o700)


def store_path_problem(path: Path) -> str | None:
    """Why the server could not keep a store file at ``path`` (None: it can), so a bad
    --responses-store is refused at start, not as a 500 on the first response stored."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent
    while not parent.exists():  # the nearest existing ancestor is where the dirs are made
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "is not writable"
    return None

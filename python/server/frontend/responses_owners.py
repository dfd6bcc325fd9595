"""Which process runs a stored response, when several processes share one store file.

Each ResponseStore object is an owner, named `<pid>-<16 hex digits>` (the name written on
the rows it runs), that holds an exclusive flock on `<file>.owners/<name>` for as long as
it lives. A lock is freed by the kernel when its process ends, however it ends: an owner
whose lock file is free is gone, and so is the lock file once someone looked. The folder
is mode 0700 and the lock files 0600; the file system must be local (flock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import time
from pathlib import Path

from server.state_dir import make_private_dirs

OWNER = re.compile(r"[0-9]+-[0-9a-f]{16}")
_STALE_NEW = 60.0  # seconds after which an unrenamed `.<name>.new` file is a start cut short


class Owner:
    """This process's owner of one store file, and the judge of the others."""

    def __init__(self, store_path: Path) -> None:
        self.name = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.folder = store_path.with_name(store_path.name + ".owners")
        self._fd: int | None = None  # the descriptor of the locked file

    def take(self) -> None:
        """Locks <folder>/<name> for this owner's life. The file is locked under a
        temporary name, then renamed: no one sees it unlocked."""
        if self._fd is not None:
            return
        make_private_dirs(self.folder)
        new = self.folder / f".{self.name}.new"
        fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(new, self.folder / self.name)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
            raise
        self._fd = fd

    def release(self) -> None:
        """Removes this owner's lock file and gives up the lock."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.folder / self.name)
        os.close(self._fd)
        self._fd = None

    def alive(self, name: str | None) -> bool:
        """Whether the owner `name` still holds its lock (its process is alive). A dead
        owner's lock file is removed."""
        if name == self.name:
            return True
        if name is None or not OWNER.fullmatch(name):
            return False
        return _held(self.folder / name)

    def sweep(self) -> None:
        """Removes the lock files of the owners that are gone."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            path = self.folder / name
            if OWNER.fullmatch(name):
                if name != self.name:
                    _held(path)
            elif name.startswith(".") and name.endswith(".new") and OWNER.fullmatch(name[1:-4]):
                # Left by a start cut short; a young one may be about to be locked.
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(path).st_mtime > _STALE_NEW:
                        _held(path)


def _held(path: Path) -> bool:
    """Whether someone holds the lock on `path`; a file no one holds is removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:  # unreadable: not ours to judge, so taken as held
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return False
    finally:
        os.close(fd)

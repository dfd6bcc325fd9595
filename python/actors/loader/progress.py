"""Load progress: one log line per stage with its duration, a percentage bar on stderr."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("actors.loader")


@contextmanager
def stage(what: str) -> Iterator[None]:
    log.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    log.info("%s done in %.2f s", what, time.perf_counter() - t0)


class ProgressBar:
    """Writes "label: 42% (n/total)" to stderr: redrawn in place on a terminal, and as a
    line every 10% otherwise (so logs stay readable)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.n = label, max(total, 1), 0
        self._tty = sys.stderr.isatty()
        self._last_decile = -1

    def advance(self, k: int = 1) -> None:
        self.n += k
        pct = 100 * self.n // self.total
        if self._tty:
            sys.stderr.write(f"\r{self.label}: {pct:3d}% ({self.n}/{self.total})")
            if self.n >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif pct // 10 != self._last_decile:
            self._last_decile = pct // 10
            sys.stderr.write(f"{self.label}: {pct:3d}% ({self.n}/{self.total})\n")
            sys.stderr.flush()

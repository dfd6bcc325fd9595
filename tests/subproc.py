"""Environment for child Python processes started by tests: they import the very packages
this test process imports (the installed wheel in CI, the source tree in development)."""

from __future__ import annotations

import os
import sys


def child_pythonpath() -> str:
    return os.pathsep.join(p for p in sys.path if p)


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": child_pythonpath(), **extra}

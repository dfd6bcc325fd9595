"""Sampling seeds: the one rule that turns a request's seed into each choice's.

The sampler keys every draw by (seed, position), so a choice's seed alone decides its
tokens, whatever batch it runs in. The core forks a request's n choices itself, and this
module is the only place that says which seed each gets; nothing else in the repository
may derive one.

- The request seed is ``params.seed`` (as uint64) or, unseeded, 64 random bits from the
  scheduler's generator (itself seeded by the engine's ``seed``).
- Choice 0 draws with the request seed itself, so an n = 1 request is keyed exactly by
  the seed it gave.
- Choice i > 0 draws with ``mix64(mix64(seed) + i)``. Mixing the seed before adding the
  index keeps requests with nearby seeds apart: with ``mix64(seed + i)``, choice 2 of
  seed 6 and choice 1 of seed 7 would draw the same tokens.
"""

from __future__ import annotations

import random

__all__ = ["choice_seed", "mix64", "request_seed"]

U64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection on uint64 that spreads nearby inputs apart."""
    x = (x + 0x9E3779B97F4A7C15) & U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & U64
    return x ^ (x >> 31)


def request_seed(seed: int | None, rng: random.Random) -> int:
    """The uint64 seed of a request: its own (an int64 request value wraps), or a draw."""
    return rng.getrandbits(64) if seed is None else seed & U64


def choice_seed(seed: int, index: int) -> int:
    """The seed choice ``index`` of a request with request seed ``seed`` samples with."""
    if index == 0:
        return seed & U64
    return mix64((mix64(seed & U64) + index) & U64)

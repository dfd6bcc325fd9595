"""Paged-KV block pool with prefix caching (the compiled core's ``lc_block_pool``).

A ``BlockPool`` owns ``num_blocks`` KV blocks of ``block_size`` tokens. Every block is
either in use (ref count >= 1) or free (ref count 0, on an LRU free list). A full block
may be committed under a hash that chains its parent's hash with its own tokens; it
then stays findable by ``match_prefix`` while free, until an allocation evicts it
(least recently freed first)::

    hash_root(extra_key) -> h0 = block_hash(root, tokens[0:bs]) -> h1 = block_hash(h0, ...)
                            block A                               block B

Hits are verified against the stored tokens and parent hash, never trusted on the
hash alone. The pool is not thread-safe: one owner (the KV manager) calls it.

Tokens and ids may be any sequence of ints or a 1-D integer numpy array. Bad
arguments raise ``ValueError`` (``TypeError`` for non-integers); an allocation that
cannot be satisfied raises ``llmcore.OutOfBlocksError`` and changes nothing.
"""

from __future__ import annotations

from llmcore._C import BlockPool, BlockPoolStats, block_hash, hash_root

__all__ = ["BlockPool", "BlockPoolStats", "block_hash", "hash_root"]

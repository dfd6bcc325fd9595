"""KVManager: per-sequence block lists over the core's BlockPool.

Three layers: the scheduler (policy) decides who runs; this manager turns "sequence s
will compute k more tokens" into blocks; ``llmcore.BlockPool`` (mechanism) keeps the
free list, ref counts and the prefix-cache hash table. The block list and the hash
chain live on the Sequence (``block_ids``, ``block_hashes``); only this module
changes them.

Capacity verbs come in pairs: ``can_allocate``/``allocate``; ``free`` gives all of a
sequence's blocks back, tail-first, so a shared prefix is evicted last.

Prefix caching (on by default): on admission ``match_prefix`` reuses the longest
cached chain of full blocks, always leaving at least one token to compute (its
logits are needed). ``commit`` registers each block once it is full AND computed, so
a cached block's KV is always written before anyone can find it.

The chains' secret: every chain starts at ``hash_root(extra_key)``, and ``extra_key``
defaults to 64 random bits drawn from ``os.urandom`` for each manager, that is for each
engine (each data-parallel engine process holds its own manager and cache). The pool's
XXH64 chain is fast, not collision-resistant: with a root anyone can compute, a client could
search for a prefix whose chain hash equals another prompt's, and the pool (which checks
only a block's own tokens and its parent hash) would then pair that prompt's next block with
the wrong prefix. Keyed by the secret, no chain hash can be computed, nor a collision
searched for, from outside the process. A repeated prompt still hits: the secret is fixed
for the manager's life (a cache reset keeps it). vLLM keys its chains the same way (a random
root per process, unless PYTHONHASHSEED is set), so its published block hashes, like these,
are meaningful only within the engine that sent them.

Cache salts: a sequence whose params carry ``cache_salt`` looks up and commits its chain
under a root of its own, ``hash_root(key)`` with key = a 64-bit digest of the manager's
extra_key and the salt. The salt thus enters the first block's hash and, by chaining,
every later one's; since the pool verifies a hit against the stored parent hash, a
lookup from another root (another salt, or none) can never reach a salted block.
A LoRA adapter's id (``Sequence.lora_id``) enters the key the same way, so no block is
ever shared between adapters or between an adapter and the base model.

Forking (n > 1): a child shares the parent's full blocks that end before the
parent's last prompt token. The partially filled last prompt block is NOT copied;
the child recomputes those tokens (at most block_size of them, into a block of its
own). That needs no KV copy kernel, keeps every shared block read-only, and the
recomputed tail doubles as the child's own prefill that yields its first logits.

KV-cache events (``events``, a ``KVEventLog``; None unless --kv-events-config is on):
``commit`` tells each run of newly registered blocks of a default-namespace chain,
``allocate`` the published blocks the pool evicted to hand them out, ``reset_cache`` the
drop of every hash. Off, each of those verbs pays one ``is None`` test.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.core.sequence import Sequence

if TYPE_CHECKING:  # the core is imported when a manager is built, not with this module
    import llmcore

    from actors.core.kv_events import KVEventLog

__all__ = ["KVManager", "KVStats"]


@dataclass(frozen=True, slots=True)
class KVStats:
    num_blocks: int
    num_free: int  # includes free cached blocks (revivable, evicted on demand)
    num_used: int
    usage: float  # num_used / num_blocks, in [0, 1]
    prefix_queried_tokens: int  # tokens looked up at admissions
    prefix_hit_tokens: int  # of those, found in the cache
    evictions: int


class KVManager:
    def __init__(
        self,
        pool: llmcore.BlockPool,
        *,
        enable_prefix_caching: bool = True,
        extra_key: int | None = None,
    ) -> None:
        """``extra_key``: the 64-bit key of every chain (see the module docstring); None
        draws a secret one. Pass a key only to share a cache's chains on purpose."""
        import llmcore

        if extra_key is None:
            extra_key = int.from_bytes(os.urandom(8), "little")

        self._block_hash = llmcore.block_hash
        self._hash_root = llmcore.hash_root
        self.pool = pool
        self.block_size: int = pool.block_size
        self.num_blocks: int = pool.num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.extra_key = extra_key
        self._root_hash: int = llmcore.hash_root(extra_key)
        # Counted per admission that keeps its hits (an admission that is rolled back
        # because the rest does not fit is not counted; the pool's own stats are).
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0
        self.events: KVEventLog | None = None  # set by the engine for --kv-events-config

    # ------------------------------------------------------------------ admission

    def match_prefix(self, seq: Sequence) -> int:
        """Takes the cached prefix of a sequence holding no blocks; returns hit tokens.

        Sets block_ids, block_hashes and num_computed_tokens. Undo with ``free``.
        """
        assert not seq.block_ids and seq.num_computed_tokens == 0, seq
        if not self.enable_prefix_caching:
            return 0
        # At least one token must remain to compute, so look up num_tokens - 1 at most.
        lookup = seq.num_tokens - 1
        if lookup < self.block_size:
            return 0
        tokens = seq.token_slice(0, lookup)
        key = self._key_of(seq)
        hits = self.pool.match_prefix(tokens, key)
        if not hits:
            return 0
        bs = self.block_size
        parent = self._root_of(seq)
        hashes = []
        for i in range(len(hits)):
            parent = self._block_hash(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        seq.block_ids = list(hits)
        seq.block_hashes = hashes
        seq.num_computed_tokens = len(hits) * bs
        return seq.num_computed_tokens

    def record_admission(self, seq: Sequence, hit_tokens: int) -> None:
        """Counts a kept lookup (queried tokens exclude the one that must be computed)."""
        if self.enable_prefix_caching:
            self.prefix_queried_tokens += max(seq.num_tokens - 1, 0)
            self.prefix_hit_tokens += hit_tokens

    # ------------------------------------------------------------------ capacity

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks for computing num_new_tokens more tokens of seq."""
        total = seq.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size)
        return max(need - len(seq.block_ids), 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.num_free()

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grows seq's blocks to hold its next num_new_tokens (OutOfBlocksError if not)."""
        n = self.blocks_needed(seq, num_new_tokens)
        if n:
            ids = self.pool.allocate(n)
            if self.events is not None:
                self.events.allocated(ids)
            seq.block_ids.extend(ids)

    # ------------------------------------------------------------------ after a step

    def commit(self, seq: Sequence) -> None:
        """Registers every full, computed block of seq not yet registered (chained)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_ids))
        hashes = seq.block_hashes
        start = len(hashes)
        if start >= full:
            return
        ev = self.events
        if ev is not None and self._key_of(seq) != self.extra_key:
            ev = None  # a salted or adapter chain is not published (actors.core.kv_events)
        run: list[int] = []  # indices of this call's newly registered blocks, contiguous
        for i in range(start, full):
            parent = hashes[i - 1] if i else self._root_of(seq)
            tokens = seq.token_slice(i * bs, (i + 1) * bs)
            duplicate = ev is not None and ev.holds(self._block_hash(parent, tokens))
            hashes.append(self.pool.commit(seq.block_ids[i], parent, tokens))
            if ev is None:
                continue
            if duplicate:  # an identical block already holds h: this one stays unregistered
                self._tell_stored(seq, run)
                run = []
            else:
                run.append(i)
        if ev is not None:
            self._tell_stored(seq, run)

    def _tell_stored(self, seq: Sequence, run: list[int]) -> None:
        if not run:
            return
        bs, first, hashes = self.block_size, run[0], seq.block_hashes
        self.events.stored([seq.block_ids[i] for i in run], [hashes[i] for i in run],
                           hashes[first - 1] if first else None,
                           list(seq.token_slice(first * bs, (run[-1] + 1) * bs)))

    def reset_cache(self) -> None:
        """Drops every cached hash (blocks in use stay; they are not found again)."""
        self.pool.reset_cache()
        if self.events is not None:
            self.events.cleared()

    # ------------------------------------------------------------------ salts

    def _key_of(self, seq: Sequence) -> int:
        """The pool namespace (extra_key) of seq's chain: the manager's, or its salt's."""
        salt = seq.params.cache_salt
        if salt is None and not seq.lora_id:
            return self.extra_key
        # A LoRA adapter's id joins the salt under a personalisation of its own (its KV
        # differs from the base model's; no salt string can reach an adapter's namespace).
        material, person = (salt or "").encode(), b"llmserve-salt"
        if seq.lora_id:
            material, person = material + seq.lora_id.to_bytes(8, "little"), b"llmserve-lora"
        digest = hashlib.blake2b(material, digest_size=8, person=person,
                                 key=self.extra_key.to_bytes(8, "little")).digest()
        # 64 bits: two salts share a namespace with probability 2^-64; finding a salt that
        # lands in another one's needs that salt, which is the secret being protected.
        return int.from_bytes(digest, "little")

    def _root_of(self, seq: Sequence) -> int:
        key = self._key_of(seq)
        return self._root_hash if key == self.extra_key else self._hash_root(key)

    # ------------------------------------------------------------------ fork and free

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Child (no blocks yet) shares parent's blocks that lie wholly before its last
        prompt token; see the module docstring for the partial block."""
        assert not child.block_ids and child.num_computed_tokens == 0, child
        shared = min((parent.num_prompt_tokens - 1) // self.block_size, len(parent.block_ids))
        shared = min(shared, parent.num_computed_tokens // self.block_size)
        if shared == 0:
            return
        ids = parent.block_ids[:shared]
        self.pool.fork(ids)
        child.block_ids = list(ids)
        child.block_hashes = parent.block_hashes[:shared]
        child.num_computed_tokens = shared * self.block_size

    def free(self, seq: Sequence) -> None:
        """Returns all of seq's blocks (tail-first) and forgets its computed tokens."""
        if seq.block_ids:
            self.pool.free(seq.block_ids[::-1])
        seq.block_ids = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # ------------------------------------------------------------------ observation

    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]; free cached blocks count as free."""
        return (self.num_blocks - self.pool.num_free()) / self.num_blocks

    def stats(self) -> KVStats:
        s = self.pool.stats()
        return KVStats(
            num_blocks=self.num_blocks,
            num_free=self.pool.num_free(),
            num_used=self.num_blocks - self.pool.num_free(),
            usage=self.usage(),
            prefix_queried_tokens=self.prefix_queried_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            evictions=s.evictions,
        )


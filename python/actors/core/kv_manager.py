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
A prompt given as embeddings (``Generate.prompt_embeds``) has placeholder token ids, which
say nothing of its KV: the embeddings' digest enters the key the same way, so its blocks are
found again only by a prompt with the same embeddings (to the bit), never by a token prompt.

Forking (n > 1): a child shares the parent's full blocks that end before the
parent's last prompt token. The partially filled last prompt block is NOT copied;
the child recomputes those tokens (at most block_size of them, into a block of its
own). That needs no KV copy kernel, keeps every shared block read-only, and the
recomputed tail doubles as the child's own prefill that yields its first logits. A beam
of a beam search forks the same way at an output position (``upto``: its computed length):
the child shares the full blocks and recomputes the partial last one plus its new token.

KV cache groups (``group_windows``; actors.core.kv_groups): a model with sliding-window
layers has one block table per group on each sequence (group 0's in ``block_ids``, the
others' in ``group_block_ids``), all drawn from the one pool, a block id being one page of
the same bytes in every group. Every verb works group by group: ``blocks_needed`` sums the
groups' needs (a sliding group's freed entries count as held, so its need stays bounded),
``allocate`` takes them in one pool call, ``fork`` and ``free`` share and return each
group's live blocks. After each step (``commit``) and at admission, a sliding group's
blocks that lie wholly before ``num_computed_tokens - window + 1`` (no token still to
compute attends to them) go back to the pool and their entries become ``NULL_BLOCK``: a
sequence holds about window / block_size blocks per sliding group, however long. A parent
whose n - 1 siblings have not forked yet keeps the window of its fork point (the first
token a child recomputes), so a child never needs a block its parent has freed; a beam
keeps the window of its last full block, where it may fork next.

Prefix caching with groups: each group chains under its own key (group 0 under the
sequence's, group g under a digest of it and g): the same tokens have different KV in
different layers. A hit is the longest prefix every group finds by walking its chain from
the first block, and each group's extra hits go straight back. A freed sliding block keeps
its hash on the pool's free list, so it is found again only while it has not been handed
out (the pool drops the hash when it evicts), never after: a hit never reuses a freed
block's overwritten KV. The cost: a sliding group frees its oldest blocks first, so under
memory pressure its chains break at the start and a long shared prefix hits less often
than on a full-attention model. With one group (no sliding layer) nothing of this runs.

KV-cache events (``events``, a ``KVEventLog``; None unless --kv-events-config is on):
``commit`` tells each run of newly registered blocks of a default-namespace chain,
``allocate`` the published blocks the pool evicted to hand them out, ``reset_cache`` the
drop of every hash. Off, each of those verbs pays one ``is None`` test. Only group 0's
chains are published (with groups, the blocks of the other layers are not announced).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.core.kv_groups import max_blocks_per_seq
from actors.core.sequence import Sequence

if TYPE_CHECKING:  # the core is imported when a manager is built, not with this module
    import llmcore

    from actors.core.kv_events import KVEventLog

__all__ = ["NULL_BLOCK", "KVManager", "KVStats"]

# A sliding group's table entry whose block the window has left (freed). The runner gives
# the core block 0 in its place: the kernels read no position before a query's window.
NULL_BLOCK = -1


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
        group_windows: tuple[int | None, ...] = (None,),
    ) -> None:
        """``extra_key``: the 64-bit key of every chain (see the module docstring); None
        draws a secret one. Pass a key only to share a cache's chains on purpose.
        ``group_windows``: per KV cache group, the window its blocks are freed by (None:
        kept); one group, the default, is a model without sliding layers."""
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
        self.group_windows = tuple(group_windows)
        self.num_groups = len(self.group_windows)
        if self.num_groups < 1 or any(w is not None and w < 1 for w in self.group_windows):
            raise ValueError(f"group_windows must be None or >= 1 each, got {group_windows}")
        self._sliding = any(w is not None for w in self.group_windows)
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
        hits = [self.pool.match_prefix(tokens, self._group_key(key, g))
                for g in range(self.num_groups)]
        n = min(len(h) for h in hits)
        for h in hits:  # what only some groups found goes back
            if len(h) > n:
                self.pool.free(h[n:][::-1])
        if not n:
            return 0
        bs = self.block_size
        ids, hashes = self._tables(seq)
        for g in range(self.num_groups):
            parent = self._root_of(seq, g)
            for i in range(n):
                parent = self._block_hash(parent, tokens[i * bs : (i + 1) * bs])
                hashes[g].append(parent)
            ids[g].extend(hits[g][:n])
        seq.num_computed_tokens = n * bs
        self._trim(seq)
        return seq.num_computed_tokens

    def record_admission(self, seq: Sequence, hit_tokens: int) -> None:
        """Counts a kept lookup (queried tokens exclude the one that must be computed)."""
        if self.enable_prefix_caching:
            self.prefix_queried_tokens += max(seq.num_tokens - 1, 0)
            self.prefix_hit_tokens += hit_tokens

    # ------------------------------------------------------------------ capacity

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks for computing num_new_tokens more tokens of seq (all groups)."""
        total = seq.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size)
        return sum(max(need - len(t), 0) for t in self._tables(seq)[0])

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.num_free()

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grows seq's blocks to hold its next num_new_tokens (OutOfBlocksError if not)."""
        n = self.blocks_needed(seq, num_new_tokens)
        if n:
            ids = self.pool.allocate(n)
            if self.events is not None:
                self.events.allocated(ids)
            need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
            at = 0
            for table in self._tables(seq)[0]:
                k = max(need - len(table), 0)
                table.extend(ids[at: at + k])
                at += k

    # ------------------------------------------------------------------ after a step

    def commit(self, seq: Sequence) -> None:
        """After a step: registers every full, computed block of seq not yet registered
        (chained, group by group), then frees what the sliding windows have left."""
        if self.enable_prefix_caching:
            ids, hashes = self._tables(seq)
            for g in range(self.num_groups):
                self._register(seq, g, ids[g], hashes[g])
        self._trim(seq)

    def _register(self, seq: Sequence, g: int, ids: list[int], hashes: list[int]) -> None:
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(ids))
        start = len(hashes)
        if start >= full:
            return
        ev = self.events
        if ev is not None and (g or self._key_of(seq) != self.extra_key):
            ev = None  # a salted or adapter chain is not published (actors.core.kv_events)
        run: list[int] = []  # indices of this call's newly registered blocks, contiguous
        for i in range(start, full):
            parent = hashes[i - 1] if i else self._root_of(seq, g)
            tokens = seq.token_slice(i * bs, (i + 1) * bs)
            duplicate = ev is not None and ev.holds(self._block_hash(parent, tokens))
            hashes.append(self.pool.commit(ids[i], parent, tokens))
            if ev is None:
                continue
            if duplicate:  # an identical block already holds h: this one stays unregistered
                self._tell_stored(seq, run)
                run = []
            else:
                run.append(i)
        if ev is not None:
            self._tell_stored(seq, run)

    def _trim(self, seq: Sequence) -> None:
        """Frees each sliding group's blocks that lie wholly before the window of the first
        token still to compute (or of the fork point, while children are to fork)."""
        if not self._sliding:
            return
        upto = seq.num_computed_tokens
        if seq.pending_children:
            upto = min(upto, (seq.num_prompt_tokens - 1) // self.block_size * self.block_size)
        elif seq.beam is not None:  # a beam may fork at its last full block
            upto = upto // self.block_size * self.block_size
        tables = self._tables(seq)[0]
        for w, table in zip(self.group_windows, tables):
            if w is None:
                continue
            # Blocks [0, n) end at or before upto - w + 1, the first position still seen;
            # the freed entries are a prefix, so walking back from n - 1 meets only new ones.
            i = min((upto - w + 1) // self.block_size, len(table)) - 1
            freed = []
            while i >= 0 and table[i] != NULL_BLOCK:
                freed.append(table[i])
                table[i] = NULL_BLOCK
                i -= 1
            if freed:
                self.pool.free(freed[::-1])

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
        embeds = getattr(seq.kind, "prompt_embeds", None)
        if salt is None and not seq.lora_id and embeds is None:
            return self.extra_key
        # A LoRA adapter's id joins the salt under a personalisation of its own (its KV
        # differs from the base model's; no salt string can reach an adapter's namespace).
        material, person = (salt or "").encode(), b"llmserve-salt"
        if seq.lora_id:
            material, person = material + seq.lora_id.to_bytes(8, "little"), b"llmserve-lora"
        if embeds is not None:  # its fixed-size digest first, under a person of its own
            material = embeds.digest + material
            person = b"llmserve-embl" if seq.lora_id else b"llmserve-embd"
        digest = hashlib.blake2b(material, digest_size=8, person=person,
                                 key=self.extra_key.to_bytes(8, "little")).digest()
        # 64 bits: two salts share a namespace with probability 2^-64; finding a salt that
        # lands in another one's needs that salt, which is the secret being protected.
        return int.from_bytes(digest, "little")

    def _group_key(self, key: int, g: int) -> int:
        """The namespace of group g's chains: group 0 keeps the sequence's key."""
        if not g:
            return key
        digest = hashlib.blake2b(g.to_bytes(4, "little"), digest_size=8,
                                 person=b"llmserve-kvgrp", key=key.to_bytes(8, "little"))
        return int.from_bytes(digest.digest(), "little")

    def _root_of(self, seq: Sequence, g: int = 0) -> int:
        key = self._key_of(seq)
        if key == self.extra_key and not g:
            return self._root_hash
        return self._hash_root(self._group_key(key, g))

    # ------------------------------------------------------------------ groups

    def _tables(self, seq: Sequence) -> tuple[list[list[int]], list[list[int]]]:
        """seq's block tables and hash lists, group 0 first (the lists themselves)."""
        extra = self.num_groups - 1
        if len(seq.group_block_ids) != extra:
            seq.group_block_ids = [[] for _ in range(extra)]
            seq.group_block_hashes = [[] for _ in range(extra)]
        return ([seq.block_ids, *seq.group_block_ids],
                [seq.block_hashes, *seq.group_block_hashes])

    def held_blocks(self, seq: Sequence) -> list[int]:
        """Per group: the blocks seq holds now (freed sliding entries excluded)."""
        return [sum(b != NULL_BLOCK for b in t) for t in self._tables(seq)[0]]

    def max_blocks_per_seq(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks a sequence of num_tokens holds at once (kv_groups' bound)."""
        return max_blocks_per_seq(self.group_windows, num_tokens, max_chunk, self.block_size)

    # ------------------------------------------------------------------ fork and free

    def fork(self, parent: Sequence, child: Sequence, upto: int | None = None) -> None:
        """Child (no blocks yet) shares parent's computed blocks that lie wholly before
        position ``upto`` (None: its last prompt token, for n > 1; a beam forks at its
        computed length); see the module docstring for the partial block."""
        assert not child.block_ids and child.num_computed_tokens == 0, child
        if upto is None:
            upto = parent.num_prompt_tokens - 1
        shared = min(upto // self.block_size, len(parent.block_ids))
        shared = min(shared, parent.num_computed_tokens // self.block_size)
        if shared == 0:
            return
        p_ids, p_hashes = self._tables(parent)
        c_ids, c_hashes = self._tables(child)
        for g in range(self.num_groups):
            ids = p_ids[g][:shared]
            self.pool.fork([b for b in ids if b != NULL_BLOCK])
            c_ids[g].extend(ids)
            c_hashes[g].extend(p_hashes[g][:shared])
        child.num_computed_tokens = shared * self.block_size

    def free(self, seq: Sequence) -> None:
        """Returns all of seq's blocks (tail-first, the last group first) and forgets its
        computed tokens."""
        for table in self._tables(seq)[0][::-1]:
            live = [b for b in table[::-1] if b != NULL_BLOCK]
            if live:
                self.pool.free(live)
        seq.block_ids = []
        seq.block_hashes = []
        seq.group_block_ids = []
        seq.group_block_hashes = []
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


"""BlockPool: a stateful property test against a plain model, plus error paths."""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import llmcore
from llmcore import BlockPool, OutOfBlocksError, block_hash, hash_root

NUM_BLOCKS = 6
BLOCK_SIZE = 2
VOCAB = 3  # few distinct tokens, so identical blocks and duplicate commits are common

tokens_st = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=4 * BLOCK_SIZE)


class PoolMachine(RuleBasedStateMachine):
    """Every held sequence owns one reference on each of its blocks.

    content[b] is what block b holds since its last allocation: (parent hash, tokens)
    as committed. A prefix hit must return blocks whose content is exactly the queried
    chain; an evicted block has no content, so returning one fails the lookup.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS, BLOCK_SIZE)
        self.refs = [0] * NUM_BLOCKS
        self.content: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.seqs: list[list[int]] = []
        self.prompts: list[tuple[int, list[int]]] = []
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    # ---- model helpers --------------------------------------------------------
    def _allocated(self, ids: list[int]) -> None:
        assert len(set(ids)) == len(ids)
        for b in ids:
            assert self.refs[b] == 0, f"block {b} handed out while in use"
            self.refs[b] = 1
            self.content.pop(b, None)  # its old KV is overwritten from now on
        self.seqs.append(ids)

    def _matched(self, tokens: list[int], extra_key: int, hit: list[int]) -> None:
        parent = hash_root(extra_key)
        for i, b in enumerate(hit):
            chunk = tuple(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
            assert self.content.get(b) == (parent, chunk), f"block {b} does not hold {chunk}"
            parent = block_hash(parent, chunk)
        for b in hit:
            self.refs[b] += 1
        self.queries += len(tokens)
        self.hits += len(hit) * BLOCK_SIZE
        self.seqs.append(hit)

    # ---- rules ----------------------------------------------------------------
    @rule(n=st.integers(0, 5))
    def allocate(self, n: int) -> None:
        if n > self.refs.count(0):
            with pytest.raises(OutOfBlocksError):
                self.pool.allocate(n)
            return
        self._allocated(self.pool.allocate(n))

    @rule(tokens=tokens_st, extra_key=st.sampled_from([0, 1]), finish=st.booleans())
    def prefill(self, tokens: list[int], extra_key: int, finish: bool) -> None:
        """Allocate a prompt's blocks and commit its full ones: it then matches in full.

        finish: the request ends at once, leaving its blocks free but cached (revivable).
        """
        n_full = len(tokens) // BLOCK_SIZE
        n_blocks = -(-len(tokens) // BLOCK_SIZE)
        if n_blocks > self.refs.count(0):
            return
        ids = self.pool.allocate(n_blocks)
        self._allocated(ids)
        parent = hash_root(extra_key)
        for i in range(n_full):
            chunk = tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
            h = self.pool.commit(ids[i], parent, chunk)
            assert h == block_hash(parent, chunk)
            assert self.pool.commit(ids[i], parent, chunk) == h  # idempotent
            self.content[ids[i]] = (parent, tuple(chunk))
            parent = h
        self.prompts.append((extra_key, tokens))
        # These blocks are in use, so each is registered or an identical copy is.
        hit = self.pool.match_prefix(tokens, extra_key)
        assert len(hit) == n_full
        self._matched(tokens, extra_key, hit)
        if finish:
            for seq in (self.seqs.pop(), self.seqs.pop()):
                self.pool.free(seq[::-1])
                for b in seq:
                    self.refs[b] -= 1

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        if self.prompts and data.draw(st.booleans()):
            extra_key, tokens = data.draw(st.sampled_from(self.prompts))
            cut = data.draw(st.integers(0, len(tokens)))
            tokens = tokens[:cut] + data.draw(tokens_st)
        else:
            extra_key, tokens = data.draw(st.sampled_from([0, 1])), data.draw(tokens_st)
        max_blocks = data.draw(st.none() | st.integers(0, 4))
        as_array = data.draw(st.booleans())
        query = np.asarray(tokens, dtype=np.int64) if as_array else tokens
        hit = self.pool.match_prefix(query, extra_key=extra_key, max_blocks=max_blocks)
        assert len(hit) <= len(tokens) // BLOCK_SIZE
        assert max_blocks is None or len(hit) <= max_blocks
        self._matched(tokens, extra_key, hit)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.pool.fork(seq)
        for b in seq:
            self.refs[b] += 1
        self.seqs.append(list(seq))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1)))
        self.pool.free(seq[::-1])  # tail first
        for b in seq:
            self.refs[b] -= 1

    @rule()
    def reset_cache(self) -> None:
        self.pool.reset_cache()
        assert self.pool.stats().num_cached == 0

    @rule()
    def free_everything(self) -> None:
        for seq in self.seqs:
            self.pool.free(seq[::-1])
        self.seqs.clear()
        self.refs = [0] * NUM_BLOCKS
        assert self.pool.num_free() == NUM_BLOCKS

    # ---- error paths: each must leave the pool unchanged ---------------------------
    @rule(data=st.data())
    def rejected(self, data: st.DataObject) -> None:
        before = self.pool.stats()
        free_ids = [b for b in range(NUM_BLOCKS) if self.refs[b] == 0]
        used_ids = [b for b in range(NUM_BLOCKS) if self.refs[b] > 0]
        bad_id = data.draw(st.sampled_from([-1, NUM_BLOCKS, NUM_BLOCKS + 7]))
        with pytest.raises(ValueError):
            self.pool.free([bad_id])
        with pytest.raises(ValueError):
            self.pool.fork([bad_id])
        with pytest.raises(ValueError):
            self.pool.ref_count(bad_id)
        if free_ids:
            b = data.draw(st.sampled_from(free_ids))
            with pytest.raises(ValueError):
                self.pool.free([b])  # double free
            with pytest.raises(ValueError):
                self.pool.fork([b])
            with pytest.raises(ValueError):
                self.pool.commit(b, hash_root(), [0] * BLOCK_SIZE)
        if used_ids:
            b = data.draw(st.sampled_from(used_ids))
            with pytest.raises(ValueError):
                self.pool.free([b] * (self.refs[b] + 1))  # one reference too many
            with pytest.raises(ValueError):
                self.pool.commit(b, hash_root(), [0] * (BLOCK_SIZE + 1))
            if free_ids:  # a valid id next to a bad one: all or nothing
                with pytest.raises(ValueError):
                    self.pool.free([b, free_ids[0]])
        assert self.pool.stats() == before

    # ---- invariants -------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        self.pool.check()
        assert Counter(b for seq in self.seqs for b in seq) == Counter(
            {b: r for b, r in enumerate(self.refs) if r}
        )
        for b in range(NUM_BLOCKS):
            ref = self.pool.ref_count(b)
            assert ref >= 0
            assert ref == self.refs[b]
        s = self.pool.stats()
        assert s.num_free == self.pool.num_free() == self.refs.count(0)
        assert s.num_used == NUM_BLOCKS - s.num_free
        assert 0 <= s.num_free_cached <= min(s.num_free, s.num_cached)
        assert (s.queries, s.hits) == (self.queries, self.hits)
        assert s.evictions >= self.evictions
        self.evictions = s.evictions

    def teardown(self) -> None:
        for seq in self.seqs:
            self.pool.free(seq)
        assert self.pool.num_free() == NUM_BLOCKS
        self.pool.check()


PoolMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase


# ---- plain tests --------------------------------------------------------------------


def _xxh64(data: bytes) -> int:
    """Reference XXH64 (seed 0), to pin the hash format: parent LE64 || tokens LE32."""
    m = (1 << 64) - 1
    p1, p2, p3, p4, p5 = (
        0x9E3779B185EBCA87,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x85EBCA77C2B2AE63,
        0x27D4EB2F165667C5,
    )

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (64 - r))) & m

    def rnd(acc: int, lane: int) -> int:
        return rotl((acc + lane * p2) & m, 31) * p1 & m

    n, i = len(data), 0
    if n >= 32:
        v = [(p1 + p2) & m, p2, 0, (-p1) & m]
        while i + 32 <= n:
            lanes = [int.from_bytes(data[i + 8 * k : i + 8 * k + 8], "little") for k in range(4)]
            v = [rnd(acc, lane) for acc, lane in zip(v, lanes)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
        for lane in v:
            h = ((h ^ rnd(0, lane)) * p1 + p4) & m
    else:
        h = p5
    h = (h + n) & m
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, int.from_bytes(data[i : i + 8], "little")), 27) * p1 + p4) & m
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (int.from_bytes(data[i : i + 4], "little") * p1 & m), 23) * p2 + p3) & m
        i += 4
    while i < n:
        h = rotl(h ^ (data[i] * p5 & m), 11) * p1 & m
        i += 1
    h ^= h >> 33
    h = h * p2 & m
    h ^= h >> 29
    h = h * p3 & m
    return h ^ (h >> 32)


def test_xxh64_reference_vectors() -> None:
    assert _xxh64(b"") == 0xEF46DB3751D8E999
    assert _xxh64(b"abc") == 0x44BC2CF5AD770999
    assert _xxh64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1


@pytest.mark.parametrize("n", [0, 1, 5, 6, 16, 100])
def test_block_hash_format(n: int) -> None:
    parent = 0x0123456789ABCDEF
    tokens = [(i * 7919) % 50000 - 7 for i in range(n)]
    data = struct.pack("<Q", parent) + struct.pack(f"<{n}i", *tokens)
    assert block_hash(parent, tokens) == _xxh64(data)
    assert block_hash(parent, np.asarray(tokens, dtype=np.int32)) == _xxh64(data)


def test_hash_root_separates_namespaces() -> None:
    assert hash_root() == hash_root(0)
    assert len({hash_root(k) for k in (0, 1, 2, 2**64 - 1)}) == 4
    assert block_hash(hash_root(0), [1, 2]) != block_hash(hash_root(1), [1, 2])


def test_prefix_cache_round_trip() -> None:
    pool = BlockPool(4, 2)
    assert (pool.num_blocks, pool.block_size) == (4, 2)
    tokens = [10, 11, 12, 13, 14]
    ids = pool.allocate(3)
    h0 = pool.commit(ids[0], hash_root(), tokens[0:2])
    pool.commit(ids[1], h0, tokens[2:4])
    pool.free(ids[::-1])
    s = pool.stats()
    assert (s.num_free, s.num_cached, s.num_free_cached) == (4, 2, 2)

    assert pool.match_prefix(tokens) == ids[:2]  # revived off the free list
    assert pool.match_prefix(tokens, extra_key=1) == []
    assert pool.match_prefix(tokens, max_blocks=1) == ids[:1]
    assert [pool.ref_count(b) for b in ids] == [2, 1, 0]
    s = pool.stats()
    assert (s.num_free, s.num_free_cached, s.queries, s.hits) == (2, 0, 15, 6)
    pool.free([ids[1], ids[0], ids[0]])

    # Free list now: 3, 2, 1, 0 (least recently freed first). Taking 3 evicts block 1.
    assert pool.allocate(3) == [3, ids[2], ids[1]]
    assert pool.stats().evictions == 1
    assert pool.match_prefix(tokens) == [ids[0]]  # the chain stops at the evicted block
    pool.reset_cache()
    assert pool.match_prefix(tokens) == []
    pool.check()


def test_first_copy_wins() -> None:
    pool = BlockPool(4, 2)
    a, b = pool.allocate(2)
    assert pool.commit(a, hash_root(), [1, 2]) == pool.commit(b, hash_root(), [1, 2])
    assert pool.stats().num_cached == 1
    assert pool.match_prefix([1, 2]) == [a]
    with pytest.raises(ValueError, match="other tokens"):
        pool.commit(a, hash_root(), [3, 4])


def test_out_of_blocks_changes_nothing() -> None:
    pool = BlockPool(4, 16)
    held = pool.allocate(3)
    with pytest.raises(OutOfBlocksError, match="2 blocks requested"):
        pool.allocate(2)
    assert issubclass(OutOfBlocksError, RuntimeError)
    assert OutOfBlocksError is llmcore.OutOfBlocksError
    assert pool.num_free() == 1
    assert pool.allocate(0) == []
    pool.free(held)
    assert pool.num_free() == 4


def test_argument_errors() -> None:
    for args in [(0, 16), (4, 0), (4, 1025), (2**40, 16)]:
        with pytest.raises(ValueError):
            BlockPool(*args)
    pool = BlockPool(4, 2)
    (b,) = pool.allocate(1)
    with pytest.raises(ValueError):
        pool.allocate(-1)
    with pytest.raises(ValueError):
        pool.free([b, b])  # double free inside one call
    assert pool.ref_count(b) == 1
    with pytest.raises(ValueError, match="block_size"):
        pool.commit(b, hash_root(), [1, 2, 3])
    with pytest.raises(ValueError):
        pool.commit(7, hash_root(), [1, 2])
    with pytest.raises(ValueError):
        pool.match_prefix([1, 2], max_blocks=-1)
    with pytest.raises(ValueError):
        pool.free([2**40])  # would wrap to a valid id if narrowed silently
    with pytest.raises(ValueError):
        pool.free(np.array([[b]]))
    with pytest.raises(TypeError):
        pool.free([1.0])
    with pytest.raises(TypeError):
        pool.free(np.array([b], dtype=np.float32))
    with pytest.raises(TypeError):
        pool.free("ab")
    assert pool.ref_count(b) == 1
    pool.free(np.array([b], dtype=np.uint8))
    assert pool.num_free() == 4


def test_stats_fields() -> None:
    pool = BlockPool(3, 4)
    d = pool.stats().as_dict()
    assert d == {
        "num_blocks": 3,
        "block_size": 4,
        "num_free": 3,
        "num_used": 0,
        "num_cached": 0,
        "num_free_cached": 0,
        "queries": 0,
        "hits": 0,
        "evictions": 0,
    }
    assert "num_free_cached" in repr(pool.stats())
    assert "num_blocks=3" in repr(pool)

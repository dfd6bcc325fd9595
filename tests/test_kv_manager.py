"""KVManager over the real llmcore.BlockPool: capacity verbs, prefix cache, fork, free."""

from __future__ import annotations

import llmcore  # the real pool: build the core first
import pytest

from actors.core.kv_manager import KVManager
from actors.params.sampling import SamplingParams
from actors.core.sequence import Sequence

BS = 4


def make(num_blocks: int = 16, caching: bool = True) -> tuple[llmcore.BlockPool, KVManager]:
    pool = llmcore.BlockPool(num_blocks, BS)
    return pool, KVManager(pool, enable_prefix_caching=caching)


_ids = iter(range(10**9))


def seq(tokens: list[int], outputs: list[int] = (),  # type: ignore[assignment]
        salt: str | None = None) -> Sequence:
    params = SamplingParams(max_tokens=100, cache_salt=salt)
    s = Sequence(next(_ids), "r", tokens, params, max_model_len=1000)
    s.output_token_ids.extend(outputs)
    return s


def compute(kv: KVManager, s: Sequence, n: int) -> None:
    """What a step does: blocks for n tokens, then (after the model ran) commit."""
    assert kv.can_allocate(s, n)
    kv.allocate(s, n)
    s.num_computed_tokens += n
    kv.commit(s)


def test_allocate_grows_by_whole_blocks() -> None:
    pool, kv = make(8)
    s = seq(list(range(10)))
    assert kv.blocks_needed(s, 10) == 3
    compute(kv, s, 10)
    assert len(s.block_ids) == 3 and pool.num_free() == 5
    s.output_token_ids.append(99)
    assert kv.blocks_needed(s, 1) == 0  # token 10 fits in block 2
    compute(kv, s, 1)
    s.output_token_ids.extend([98, 97])
    assert kv.blocks_needed(s, 2) == 1
    assert kv.usage() == pytest.approx(3 / 8)
    kv.free(s)
    assert pool.num_free() == 8 and kv.usage() == 0.0 and s.num_computed_tokens == 0
    pool.check()


def test_can_allocate_is_exact_at_the_edge() -> None:
    pool, kv = make(3)
    a = seq(list(range(8)))
    compute(kv, a, 8)
    b = seq(list(range(100, 105)))
    assert kv.can_allocate(b, 4) and not kv.can_allocate(b, 5)
    with pytest.raises(llmcore.OutOfBlocksError):
        kv.allocate(b, 5)
    assert b.block_ids == [] and pool.num_free() == 1  # all or nothing
    assert kv.usage() == pytest.approx(2 / 3)


def test_commit_chains_hashes_of_full_computed_blocks() -> None:
    pool, kv = make()
    toks = list(range(1, 11))
    s = seq(toks)
    compute(kv, s, 6)  # block 0 full, block 1 half
    assert len(s.block_hashes) == 1
    compute(kv, s, 4)
    root = llmcore.hash_root(kv.extra_key)
    h0 = llmcore.block_hash(root, toks[0:4])
    h1 = llmcore.block_hash(h0, toks[4:8])
    assert s.block_hashes == [h0, h1]
    assert pool.stats().num_cached == 2
    kv.free(s)
    pool.check()


def test_match_prefix_takes_hits_and_leaves_a_token() -> None:
    pool, kv = make()
    toks = list(range(1, 13))  # exactly 3 blocks
    a = seq(toks)
    compute(kv, a, 12)
    a_ids, a_hashes = list(a.block_ids), list(a.block_hashes)
    kv.free(a)  # blocks stay cached on the free list
    b = seq(toks)
    hit = kv.match_prefix(b)
    assert hit == 8  # the 3rd block would leave nothing to compute
    assert b.num_computed_tokens == 8 and b.block_hashes == a_hashes[:2]
    assert len(b.block_ids) == 2 and len(b.block_hashes) == 2
    assert [pool.ref_count(x) for x in b.block_ids] == [1, 1]
    kv.record_admission(b, hit)
    assert (kv.prefix_queried_tokens, kv.prefix_hit_tokens) == (11, 8)
    compute(kv, b, 4)
    assert len(b.block_hashes) == 3
    c = seq(toks + [50])
    assert kv.match_prefix(c) == 12
    # Two blocks shared with b; b computed its 3rd block anew, and the first copy of
    # that content (a's, free and cached) is the one found.
    assert c.block_ids[:2] == b.block_ids[:2] and c.block_ids[2] == a_ids[2]
    assert [pool.ref_count(x) for x in c.block_ids] == [2, 2, 1]
    kv.free(b)
    kv.free(c)
    assert pool.num_free() == pool.num_blocks
    pool.check()


def test_match_prefix_hashes_continue_the_chain() -> None:
    pool, kv = make()
    toks = list(range(1, 14))
    a = seq(toks)
    compute(kv, a, 13)
    expected = list(a.block_hashes)
    kv.free(a)
    b = seq(toks + [77, 78, 79])
    assert kv.match_prefix(b) == 12
    assert b.block_hashes == expected
    compute(kv, b, 4)  # its 4th block commits on top of the matched chain
    assert b.block_hashes[3] == llmcore.block_hash(expected[2], [13, 77, 78, 79])
    kv.free(b)
    pool.check()


def test_cache_salt_roots_a_chain_of_its_own() -> None:
    pool, kv = make()
    toks = list(range(1, 14))
    plain, salted = seq(toks), seq(toks, salt="tenant")
    again = seq(toks, salt="tenant")
    compute(kv, plain, 13)
    compute(kv, salted, 13)
    # The salt enters the first block's hash, and so every later block's: no block of the
    # salted chain equals its unsalted twin, although their tokens are the same.
    assert all(x != y for x, y in zip(plain.block_hashes, salted.block_hashes, strict=True))
    assert pool.stats().num_cached == 6  # two chains, although the tokens are the same
    salted_hashes = list(salted.block_hashes)
    kv.free(plain)
    kv.free(salted)
    assert kv.match_prefix(again) == 12
    assert again.block_hashes == salted_hashes
    assert kv.match_prefix(seq(toks, salt="other")) == 0
    assert kv.match_prefix(seq(toks)) == 12
    pool.check()


def test_chains_are_keyed_by_a_secret_of_each_manager() -> None:
    toks = list(range(1, 14))
    pool_a, kv_a = make()
    pool_b, kv_b = make()
    a, b = seq(toks), seq(toks)
    compute(kv_a, a, 13)
    compute(kv_b, b, 13)
    # The same prompt chains to other keys in another manager (another engine process)...
    assert kv_a.extra_key != kv_b.extra_key
    assert all(x != y for x, y in zip(a.block_hashes, b.block_hashes, strict=True))
    # ...and to none anyone can compute without the secret: the first block's hash is
    # keyed by it, not by the fixed root every build shares.
    public = llmcore.block_hash(llmcore.hash_root(0), toks[0:4])
    assert a.block_hashes[0] == llmcore.block_hash(llmcore.hash_root(kv_a.extra_key),
                                                   toks[0:4])
    assert public not in (a.block_hashes[0], b.block_hashes[0])
    # A repeated prompt still hits each manager's own cache.
    kv_a.free(a)
    kv_b.free(b)
    assert kv_a.match_prefix(seq(toks)) == 12
    assert kv_b.match_prefix(seq(toks + [99])) == 12
    # A cache salt's namespace is keyed by the secret too.
    assert kv_a._key_of(seq(toks, salt="t")) != kv_b._key_of(seq(toks, salt="t"))
    pool_a.check()
    pool_b.check()


def test_a_chain_crafted_without_the_secret_is_never_hit() -> None:
    pool, kv = make()
    toks = list(range(1, 14))
    # Blocks registered under the chain anyone can compute (the unkeyed root): what a
    # crafted prefix would have to match.
    crafted = pool.allocate(3)
    parent = llmcore.hash_root(0)
    for i, bid in enumerate(crafted):
        parent = pool.commit(bid, parent, toks[i * BS : (i + 1) * BS])
    pool.free(crafted[::-1])
    assert pool.match_prefix(toks, 0) == crafted  # they are there, under the public root
    assert kv.match_prefix(seq(toks)) == 0  # the manager's lookups start elsewhere
    pool.check()


def test_the_secret_comes_from_the_os() -> None:
    keys = {KVManager(llmcore.BlockPool(2, BS)).extra_key for _ in range(64)}
    assert len(keys) == 64 and all(0 <= k < 2**64 for k in keys)
    # an explicit key is kept (a host that shares one cache between managers on purpose)
    assert KVManager(llmcore.BlockPool(2, BS), extra_key=5).extra_key == 5


def test_prefix_caching_off() -> None:
    pool, kv = make(caching=False)
    a = seq(list(range(12)))
    compute(kv, a, 12)
    assert a.block_hashes == [] and pool.stats().num_cached == 0
    kv.free(a)
    assert kv.match_prefix(seq(list(range(12)))) == 0


def test_fork_shares_full_blocks_before_the_last_prompt_token() -> None:
    pool, kv = make()
    for n_prompt, shared in ((10, 2), (8, 1), (3, 0), (9, 2)):
        parent = seq(list(range(n_prompt)))
        compute(kv, parent, n_prompt)
        child = seq(list(range(n_prompt)))
        kv.fork(parent, child)
        assert child.block_ids == parent.block_ids[:shared], n_prompt
        assert child.num_computed_tokens == shared * BS
        assert child.block_hashes == parent.block_hashes[:shared]
        assert all(pool.ref_count(b) == 2 for b in child.block_ids)
        compute(kv, child, n_prompt - shared * BS)  # recompute the tail into own blocks
        assert set(child.block_ids[shared:]).isdisjoint(parent.block_ids)
        kv.free(parent)
        kv.free(child)
        assert pool.num_free() == pool.num_blocks
    pool.check()


def test_free_is_tail_first_so_prefixes_are_evicted_last() -> None:
    pool, kv = make(3)
    toks = list(range(1, 13))
    a = seq(toks)
    compute(kv, a, 12)
    kv.free(a)
    # One fresh allocation must evict a's LAST block, keeping the 2-block prefix.
    other = seq([500, 501, 502])
    compute(kv, other, 3)
    assert pool.stats().evictions == 1
    b = seq(toks)
    assert kv.match_prefix(b) == 8
    kv.free(b)
    kv.free(other)
    pool.check()


def test_stats() -> None:
    pool, kv = make(8)
    s = seq(list(range(6)))
    compute(kv, s, 6)
    st = kv.stats()
    assert (st.num_blocks, st.num_used, st.num_free) == (8, 2, 6)
    assert st.usage == pytest.approx(0.25)

"""KV cache groups: the layout for per-layer windows, and KVManager with a sliding group over
the real llmcore.BlockPool (blocks freed behind the window, prefix hits across groups, fork,
events)."""

from __future__ import annotations

import llmcore
import pytest

from actors.core.kv_events import KVEventLog
from actors.core.kv_groups import KVGroups, max_blocks_per_seq
from actors.core.kv_manager import NULL_BLOCK, KVManager
from actors.core.sequence import Sequence
from actors.params.sampling import SamplingParams

BS, W = 4, 8


def test_gemma3_layers_make_six_groups_of_three() -> None:
    windows = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    g = KVGroups.from_windows(windows)
    assert g.num_slots == 3 and g.windows == (None,) + (512,) * 5
    assert g.layers[0] == (5, 11, 17) and g.layers[1] == (0, 1, 2) and g.layers[2] == (3, 4, 6)
    assert g.group_of()[6] == 2 and g.slot_of()[6] == 2 and g.slot_of()[17] == 2
    assert "6 KV cache groups of 3 layers" in g.describe()


@pytest.mark.parametrize(("windows", "want"), [
    ([W, None, W, None], KVGroups((None, W), ((1, 3), (0, 2)), 2)),  # Gemma 2
    ([W] * 3, KVGroups((W,), ((0, 1, 2),), 3)),  # Mistral: one sliding group
    ([None] * 3, KVGroups.single(3)),
    ([None, None, W, W, W], KVGroups((None, W, W), ((0, 1), (2, 3), (4,)), 2)),  # uneven
])
def test_groups_of_windows(windows: list, want: KVGroups) -> None:
    assert KVGroups.from_windows(windows) == want
    assert KVGroups.from_windows(windows, hybrid=False) == KVGroups.single(len(windows))


def test_the_bound_of_a_sequence() -> None:
    assert max_blocks_per_seq((None,), 100, 64, BS) == 25
    # A sliding group: [s - 7, s + 64) spans at most 18 blocks of 4, plus the fork margin.
    assert max_blocks_per_seq((None, W), 1000, 64, BS) == 250 + 20
    assert max_blocks_per_seq((None, W), 20, 64, BS) == 5 + 5  # never above the full count


def make(num_blocks: int = 64, windows: tuple = (None, W)) -> tuple:
    pool = llmcore.BlockPool(num_blocks, BS)
    return pool, KVManager(pool, group_windows=windows, extra_key=7)


def seq(n: int, first: int = 0) -> Sequence:
    return Sequence(first, "r", list(range(first, first + n)), SamplingParams(max_tokens=99),
                    max_model_len=1000)


def compute(kv: KVManager, s: Sequence, n: int) -> None:
    kv.allocate(s, n)
    s.num_computed_tokens += n
    kv.commit(s)


def test_sliding_blocks_behind_the_window_go_back() -> None:
    pool, kv = make()
    s = seq(40)
    assert kv.blocks_needed(s, 40) == 20  # 10 a group
    compute(kv, s, 40)
    # The next token to compute (40) sees 33..40: blocks 0..7 ([0, 32)) are behind it.
    assert s.group_block_ids[0][:8] == [NULL_BLOCK] * 8
    assert kv.held_blocks(s) == [10, 2] and pool.num_free() == 64 - 12
    for _ in range(6):  # decode: one block freed each time the window crosses one
        s.output_token_ids.append(1)
        compute(kv, s, 1)
    assert kv.held_blocks(s) == [12, 3]
    assert kv.blocks_needed(s, 1) == 0
    kv.free(s)
    assert pool.num_free() == 64 and s.group_block_ids == []
    pool.check()


def test_prefix_hits_need_every_group() -> None:
    pool, kv = make(22)  # every block used: the free list is in the order of the frees
    a = seq(41)
    compute(kv, a, 41)
    kv.free(a)
    b = seq(41)
    # Freed sliding blocks keep their hash until handed out: all 10 blocks found in both.
    assert kv.match_prefix(b) == 40
    assert kv.held_blocks(b) == [10, 2]  # the sliding group's hits behind the window went back
    kv.free(b)
    # Hand out the blocks freed first (the sliding group's oldest): its chain breaks at its
    # first block, so there is no hit, and the full group's hits go back.
    taken = pool.allocate(8)
    c = seq(41)
    assert kv.match_prefix(c) == 0 and c.block_ids == [] and pool.num_free() == 22 - 8
    pool.free(taken)
    pool.check()


def test_fork_keeps_the_window_of_the_fork_point() -> None:
    pool, kv = make()
    parent = seq(48)
    parent.pending_children = 1
    compute(kv, parent, 48)
    # Children recompute from 44 (window from 37, block 9): the parent keeps block 9.
    assert kv.held_blocks(parent) == [12, 3]
    child = seq(48, first=0)
    kv.fork(parent, child)
    assert child.num_computed_tokens == 44
    assert child.group_block_ids[0][9:] == parent.group_block_ids[0][9:11]
    assert pool.ref_count(parent.group_block_ids[0][9]) == 2
    parent.pending_children = 0
    parent.output_token_ids.append(5)
    compute(kv, parent, 1)  # the parent's own window moves on
    assert kv.held_blocks(parent) == [13, 3]
    kv.free(parent)
    kv.free(child)
    assert pool.num_free() == 64
    pool.check()


def test_only_group_zero_is_published() -> None:
    pool, kv = make(12)
    kv.events = KVEventLog(BS)
    s = seq(17)
    compute(kv, s, 17)
    stored = [e for e in kv.events.events if e["type"] == "BlockStored"]
    published = list(s.block_hashes)
    assert len(stored) == 1 and stored[0]["block_hashes"] == published
    kv.free(s)
    kv.events.events.clear()
    # Every block handed out again, group 0's published ones among them: their removal told.
    t = seq(40, first=100)
    compute(kv, t, 24)
    removed = [h for e in kv.events.events if e["type"] == "BlockRemoved"
               for h in e["block_hashes"]]
    assert sorted(removed) == sorted(published)

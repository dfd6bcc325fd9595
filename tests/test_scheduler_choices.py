"""The scheduler's choices: aborts of a request or of one choice (before and after the fork,
while preempted), and n > 1 forking, over the real llmcore.BlockPool with the deterministic
driver of test_scheduler.py."""

from __future__ import annotations

import pytest
from actors.core.sequence import Sequence, SequenceStatus
from actors.messages import SampledToken, StepResult
from test_scheduler import Driver, prompt_of

# ---------------------------------------------------------------------- abort


def test_abort_while_waiting_and_running_frees_blocks_at_once() -> None:
    d = Driver(num_blocks=32, max_num_seqs=1)
    d.add("run", prompt_of(10), t=0, max_tokens=20)
    d.add("wait", prompt_of(10, 1), t=1, max_tokens=20)
    d.step()
    assert d.pool.num_free() == 32 - 3
    outs = d.sched.abort("wait")
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("wait", True, "abort")]
    outs = d.sched.abort("run")
    assert outs[0].finish_reason == "abort" and outs[0].num_output_tokens == 1
    assert d.pool.num_free() == 32
    assert d.sched.abort("run") == []  # idempotent
    assert not d.sched.has_unfinished()
    d.assert_drained()


def test_abort_between_schedule_and_update() -> None:
    d = Driver(num_blocks=32)
    d.add("a", prompt_of(10), max_tokens=5)
    d.add("b", prompt_of(10, 1), max_tokens=5)
    d.step()
    plan = d.sched.schedule()
    d.sched.abort("a")
    assert d.pool.num_free() == 32 - 3  # a's blocks are back already
    res = tuple(SampledToken(s.seq_id, 500) for s in plan.seqs)
    outs = d.sched.update(StepResult(plan.step_id, res))
    assert [o.request_id for o in outs] == ["b"]
    nxt = d.sched.schedule()
    assert len(nxt.released_seq_ids) == 1 and len(nxt.seqs) == 1


def test_abort_of_a_request_with_unforked_siblings() -> None:
    d = Driver(num_blocks=32)
    d.add("multi", prompt_of(10), n=3, max_tokens=4)
    outs = d.sched.abort("multi")
    assert sorted(o.index for o in outs) == [0, 1, 2]
    assert all(o.finish_reason == "abort" for o in outs)
    d.assert_drained()


def forked(d: Driver, rid: str, index: int) -> Sequence:
    return next(s for s in d.sched.running if (s.request_id, s.index) == (rid, index))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_abort_one_forked_choice_frees_only_its_blocks(index: int) -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(10), n=3, max_tokens=6)
    d.step()  # choice 0 computes the prompt and draws; 1 and 2 fork
    d.step()  # 1 and 2 recompute the partial block and draw their first token
    seqs = {i: forked(d, "multi", i) for i in range(3)}
    shared = seqs[0].block_ids[:2]
    assert all(s.block_ids[:2] == shared for s in seqs.values())
    own = [b for b in seqs[index].block_ids if b not in shared]
    assert own and all(d.pool.ref_count(b) == 1 for b in own)
    free = d.pool.num_free()
    outs = d.sched.abort("multi", index)
    d.record(outs)
    assert [(o.index, o.finish_reason, o.num_output_tokens) for o in outs] == [
        (index, "abort", 2 if index == 0 else 1)]
    assert d.pool.num_free() == free + len(own)  # only its own blocks come back
    assert [d.pool.ref_count(b) for b in shared] == [2, 2]
    d.pool.check()
    assert d.sched.abort("multi", index) == []  # twice: nothing more
    d.run()
    for i in {0, 1, 2} - {index}:
        assert d.outputs[("multi", i)] == d.expected("multi", i, 6)
        assert d.finished[("multi", i)].finish_reason == "length"
    assert d.sched.abort("multi", (index + 1) % 3) == []  # finished: ignored
    assert d.sched.abort("multi", 7) == []
    d.assert_drained()


def test_choices_aborted_before_the_fork_are_never_forked() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(10), n=3, max_tokens=4)
    d.record(d.sched.abort("multi", 2))
    assert d.finished[("multi", 2)].finish_reason == "abort"
    assert d.sched.abort("multi", 2) == []
    d.run()
    assert sorted(k for k in d.outputs if k[0] == "multi") == [("multi", 0), ("multi", 1),
                                                               ("multi", 2)]
    assert d.outputs[("multi", 2)] == []
    assert all(d.outputs[("multi", i)] == d.expected("multi", i, 4) for i in (0, 1))
    assert max(len(p.seqs) for p in d.plans) == 2  # choice 2 never ran
    d.assert_drained()


def test_choice_zero_aborted_before_the_fork_still_computes_the_prompt() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(10), n=3, max_tokens=4)
    d.record(d.sched.abort("multi", 0))
    d.run()
    assert d.finished[("multi", 0)].finish_reason == "abort" and d.outputs[("multi", 0)] == []
    assert all(d.outputs[("multi", i)] == d.expected("multi", i, 4) for i in (1, 2))
    assert d.plans[0].seqs[0].num_tokens == 10  # the prompt ran once, as choice 0
    d.assert_drained()


def test_every_choice_aborted_before_the_fork_ends_the_request() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4, max_num_batched_tokens=4)
    d.add("multi", prompt_of(10), n=3, max_tokens=4)
    d.step()  # a first chunk of the prompt: blocks held, nothing forked
    assert d.pool.num_free() < 32
    for i in (1, 0, 2):
        d.record(d.sched.abort("multi", i))
    assert {i for (r, i) in d.finished if r == "multi"} == {0, 1, 2}
    assert not d.sched.has_unfinished()
    d.record(d.sched.abort("multi"))  # the whole request, after: nothing more
    d.run()
    d.assert_drained()


def test_whole_request_abort_after_one_choice_reports_each_choice_once() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4, max_num_batched_tokens=4)
    d.add("pre", prompt_of(10), n=3, max_tokens=4)
    d.step()
    d.record(d.sched.abort("pre", 1))  # before the fork
    outs = d.sched.abort("pre")
    assert sorted(o.index for o in outs) == [0, 2]
    d.record(outs)
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("post", prompt_of(10), n=3, max_tokens=4)
    d.step()
    d.record(d.sched.abort("post", 1))  # after it
    outs = d.sched.abort("post")
    assert sorted(o.index for o in outs) == [0, 2]
    d.record(outs)
    d.assert_drained()


def test_abort_of_a_preempted_choice_and_of_a_preempted_prompt() -> None:
    """A forked choice sent back to waiting is aborted there; so is choice 0 preempted
    before its siblings forked. Blocks all come back, the others' tokens are unchanged."""
    d = Driver(num_blocks=9, block_size=4, max_model_len=36, caching=False, max_num_seqs=4)
    d.add("old", prompt_of(9), t=0, max_tokens=20)
    d.add("multi", prompt_of(6, 1), t=1, n=2, max_tokens=20)
    while not any(s.status is SequenceStatus.PREEMPTED for s in d.sched.waiting):
        d.step()
        assert d.sched.has_unfinished()
    victim = next(s for s in d.sched.waiting if s.status is SequenceStatus.PREEMPTED)
    assert victim.request_id == "multi"
    d.record(d.sched.abort("multi", victim.index))
    d.pool.check()
    d.run()
    assert d.outputs[("old", 0)] == d.expected("old", 0, 20)
    other = 1 - victim.index
    assert d.outputs[("multi", other)] == d.expected("multi", other, 20)
    d.assert_drained()

    d = Driver(num_blocks=6, block_size=4, max_model_len=24, caching=False, max_num_seqs=4,
               max_num_batched_tokens=4)
    d.add("old", prompt_of(15), t=0, max_tokens=8)
    d.add("multi", prompt_of(12, 1), t=1, n=2, max_tokens=4)
    while not d.sched.num_preemptions:
        d.step()
    (seq,) = [s for s in d.sched.waiting if s.request_id == "multi"]
    assert seq.index == 0 and seq.pending_children == 1  # preempted mid-prompt
    d.record(d.sched.abort("multi", 0))
    d.run()
    assert d.outputs[("multi", 1)] == d.expected("multi", 1, 4)
    assert d.outputs[("multi", 0)] == [] and d.finished[("multi", 0)].finish_reason == "abort"
    assert d.outputs[("old", 0)] == d.expected("old", 0, 8)
    d.assert_drained()


def test_aborted_choice_leaves_the_shared_prefix_cached() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(13), n=2, max_tokens=8)
    d.step()
    d.step()
    d.record(d.sched.abort("multi", 0))
    d.record(d.sched.abort("multi", 1))
    d.assert_drained()
    d.add("again", prompt_of(13), max_tokens=1)
    d.step()
    assert d.plans[-1].seqs[0].start_pos == 12  # three committed prompt blocks found
    d.run()
    d.assert_drained()


def test_releases_after_an_empty_plan_reach_the_next_plan() -> None:
    """An empty plan never reaches the runner: what it would release (and the choices
    that ended) come with the next plan instead of being lost."""
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(10), n=2, max_tokens=4)
    d.step()
    d.step()  # the forked choice has run too: the runner holds both
    ids = sorted(s.seq_id for s in d.sched.running)
    d.record(d.sched.abort("multi", 1))
    d.record(d.sched.abort("multi"))
    empty = d.sched.schedule()
    assert empty.is_empty and empty.released_seq_ids == () and empty.finished == ()
    d.add("next", prompt_of(6, 1), max_tokens=1)
    d.step()
    plan = d.plans[-1]
    assert sorted(plan.released_seq_ids) == ids
    assert sorted(plan.finished) == [("multi", 0), ("multi", 1)]
    d.run()
    d.assert_drained()


# ---------------------------------------------------------------------- n > 1


def test_n_children_share_full_prompt_blocks() -> None:
    d = Driver(num_blocks=32, block_size=4, max_num_seqs=4)
    d.add("multi", prompt_of(10), n=3, max_tokens=5)
    d.step()  # the first sequence computes the prompt and draws
    running = d.sched.running
    assert len(running) == 3
    parent, c1, c2 = running
    shared = parent.block_ids[:2]  # tokens 0..7; block 2 holds prompt tokens 8, 9
    assert c1.block_ids == shared and c2.block_ids == shared
    assert [d.pool.ref_count(b) for b in shared] == [3, 3]
    assert c1.num_computed_tokens == 8 and c1.num_tokens == 10
    d.step()
    sizes = sorted(s.num_tokens for s in d.plans[-1].seqs)
    assert sizes == [1, 2, 2]  # parent decodes, children recompute the partial block
    d.run()
    outs = [d.outputs[("multi", i)] for i in range(3)]
    assert all(o == d.expected("multi", i, 5) for i, o in enumerate(outs))
    assert len({tuple(o) for o in outs}) == 3
    d.assert_drained()


def test_n_reserves_seats() -> None:
    d = Driver(num_blocks=64, max_num_seqs=3)
    d.add("multi", prompt_of(6), t=0, n=3, max_tokens=3)
    d.add("other", prompt_of(6, 1), t=1, max_tokens=3)
    d.step()
    assert [s.request_id for s in d.sched.running] == ["multi"] * 3  # other waits for a seat
    d.run()
    with pytest.raises(ValueError, match="max_num_seqs"):
        d.add("big", prompt_of(4), n=4)
    d.assert_drained()


def test_seeded_siblings_get_distinct_sampling_seeds() -> None:
    d = Driver(num_blocks=64, max_num_seqs=4)
    d.add("s", prompt_of(6), n=3, seed=42, max_tokens=2)
    d.step()
    d.step()
    seeds = [s.sample.seed for s in d.plans[-1].seqs if s.sample]
    assert len(seeds) == 3 and len(set(seeds)) == 3 and 42 in seeds



"""Scheduler policy over the real llmcore.BlockPool, driven by a deterministic fake model.

The driver plays the engine: it keeps per-sequence token state from NewSeq plus its own
draws (the protocol in actors.messages), checks every plan against that state and the
pool, and "samples" token f(request, choice, position). Tokens therefore do not depend
on batching, chunking or preemption, so a run can be checked token for token.
"""

from __future__ import annotations

import random
import subprocess
import sys
import zlib

import llmcore  # the real pool: build the core first
import pytest
from actors.core.kv_manager import KVManager
from actors.core.scheduler import Scheduler, SchedulerConfig
from actors.core.sequence import FinishReason, Sequence, SequenceStatus
from actors.messages import (
    Admit,
    Generate,
    Logprobs,
    PromptLogprobs,
    RequestOutput,
    SampledToken,
    StepPlan,
    StepResult,
)
from actors.params.sampling import SamplingParams
from subproc import child_pythonpath

VOCAB = 50_000
EOS = 2


def model_token(request_id: str, index: int, position: int) -> int:
    # Never EOS (2) unless a test plants it: ids start at 100.
    return 100 + zlib.crc32(f"{request_id}/{index}/{position}".encode()) % (VOCAB - 100)


class Driver:
    def __init__(
        self, num_blocks: int = 64, block_size: int = 4, *, caching: bool = True, **cfg: object
    ) -> None:
        cfg.setdefault("max_model_len", 64)
        cfg.setdefault("seed", 0)
        self.pool = llmcore.BlockPool(num_blocks, block_size)
        self.kv = KVManager(self.pool, enable_prefix_caching=caching)
        self.config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
        self.sched = Scheduler(self.config, self.kv)
        self.block_size = block_size
        self.state: dict[int, tuple[str, int, list[int], int]] = {}  # id -> rid, idx, toks, np
        self.outputs: dict[tuple[str, int], list[int]] = {}
        self.finished: dict[tuple[str, int], RequestOutput] = {}
        self.plans: list[StepPlan] = []
        self.planted: dict[tuple[str, int, int], int] = {}  # (rid, idx, pos) -> token
        self.prompt_lps: dict[str, list] = {}  # request id -> delivered prompt logprobs

    def add(self, rid: str, prompt: list[int], t: float = 0.0, **params: object) -> None:
        sp = SamplingParams(**params)  # type: ignore[arg-type]
        self.sched.add_request(Admit(rid, tuple(prompt), Generate(sp), t))

    def token(self, rid: str, idx: int, pos: int) -> int:
        return self.planted.get((rid, idx, pos), model_token(rid, idx, pos))

    def step(self) -> list[RequestOutput]:
        plan = self.sched.schedule()
        self.plans.append(plan)
        self.check_plan(plan)
        if plan.is_empty:
            return []
        sampled = []
        prompt_lps = []
        for s in plan.seqs:
            rid, idx, toks, n_prompt = self.state[s.seq_id]
            hi = min(s.start_pos + s.num_tokens, n_prompt - 1)
            if s.prompt_logprobs is not None and hi > s.start_pos:
                # The fake model scores prompt token p with logprob -p.
                entries = tuple(Logprobs(-float(p), rank=1) for p in range(s.start_pos + 1, hi + 1))
                prompt_lps.append(PromptLogprobs(s.seq_id, s.start_pos + 1, entries))
            if s.sample is not None:
                pos = len(toks) - n_prompt
                assert s.sample.position == pos
                t = self.token(rid, idx, pos)
                sampled.append(SampledToken(s.seq_id, t))
                toks.append(t)
        outs = self.sched.update(StepResult(plan.step_id, tuple(sampled), tuple(prompt_lps)))
        self.record(outs)
        return outs

    def record(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            key = (o.request_id, o.index)
            assert key not in self.finished, f"output after finish: {o}"
            self.outputs.setdefault(key, []).extend(o.new_token_ids)
            if o.prompt_logprobs is not None:
                assert o.request_id not in self.prompt_lps and o.index == 0
                self.prompt_lps[o.request_id] = list(o.prompt_logprobs)
            assert len(self.outputs[key]) == o.num_output_tokens
            if o.finished:
                self.finished[key] = o

    def check_plan(self, plan: StepPlan) -> None:
        cfg, bs = self.config, self.block_size
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens
        assert len(plan.seqs) <= cfg.max_num_seqs
        assert len(self.sched.running) <= cfg.max_num_seqs
        for sid in plan.released_seq_ids:
            del self.state[sid]
        for ns in plan.new_seqs:
            assert ns.seq_id not in self.state
            toks = list(ns.prompt_token_ids) + list(ns.output_token_ids)
            self.state[ns.seq_id] = (ns.request_id, ns.index, toks, len(ns.prompt_token_ids))
        holders: dict[int, int] = {}
        for s in plan.seqs:
            _, _, toks, _ = self.state[s.seq_id]
            end = s.start_pos + s.num_tokens
            assert s.num_tokens >= 1
            assert tuple(toks[s.start_pos : end]) == s.token_ids  # engine mirror agrees
            assert (s.sample is not None) == (end == len(toks))
            assert len(s.block_table) * bs >= end
            assert len(set(s.block_table)) == len(s.block_table)
            for b in s.block_table:
                holders[b] = holders.get(b, 0) + 1
        for b, n in holders.items():
            assert self.pool.ref_count(b) >= n  # shared blocks are referenced by each holder

    def run(self, max_steps: int = 10_000) -> int:
        steps = 0
        while self.sched.has_unfinished():
            self.step()
            steps += 1
            assert steps < max_steps, "no progress"
        return steps

    def expected(self, rid: str, idx: int, n: int) -> list[int]:
        return [self.token(rid, idx, p) for p in range(n)]

    def assert_drained(self) -> None:
        assert not self.sched.running and not len(self.sched.waiting)
        assert self.pool.num_free() == self.pool.num_blocks
        self.pool.check()


def prompt_of(n: int, salt: int = 0) -> list[int]:
    return [1000 + (salt * 7919 + i * 31) % 40_000 for i in range(n)]


# ---------------------------------------------------------------------- basics


def test_policy_modules_import_without_torch_or_core() -> None:
    code = (
        "import sys, actors.core.scheduler, actors.messages, actors.core.sequence, actors.core.kv_manager;"
        "bad = [m for m in ('torch', 'llmcore', 'numpy') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": child_pythonpath()})


def test_single_request_prefill_then_decode() -> None:
    d = Driver()
    d.add("a", prompt_of(10), max_tokens=5)
    plan_outs = d.step()
    first = d.plans[0].seqs[0]
    assert (first.start_pos, first.num_tokens, first.sample is not None) == (0, 10, True)
    assert plan_outs[0].new_token_ids == (model_token("a", 0, 0),)
    d.run()
    assert [p.seqs[0].num_tokens for p in d.plans] == [10, 1, 1, 1, 1]
    out = d.finished[("a", 0)]
    assert out.finish_reason == "length" and out.num_prompt_tokens == 10
    assert d.outputs[("a", 0)] == d.expected("a", 0, 5)
    d.assert_drained()


def test_token_budget_and_max_num_seqs_every_step() -> None:
    d = Driver(num_blocks=128, max_num_batched_tokens=16, max_num_seqs=3)
    for i in range(8):
        d.add(f"r{i}", prompt_of(5 + 3 * i, salt=i), t=i, max_tokens=4 + i)
    d.run()  # check_plan asserts both limits on every plan
    assert max(p.num_batched_tokens for p in d.plans) == 16  # the budget is used fully
    assert max(len(p.seqs) for p in d.plans) == 3
    for i in range(8):
        assert d.outputs[(f"r{i}", 0)] == d.expected(f"r{i}", 0, 4 + i)
    d.assert_drained()


def test_chunked_prefill_with_tiny_budget() -> None:
    d = Driver(num_blocks=32, max_num_batched_tokens=8, max_model_len=64, caching=False)
    d.add("long", prompt_of(50), max_tokens=3)
    d.run()
    chunks = [(p.seqs[0].start_pos, p.seqs[0].num_tokens) for p in d.plans]
    assert chunks == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 8), (48, 2), (50, 1), (51, 1)]
    sampled = [p.seqs[0].sample is not None for p in d.plans]
    assert sampled == [False] * 6 + [True] * 3  # mid-prompt chunks draw nothing
    assert d.outputs[("long", 0)] == d.expected("long", 0, 3)
    d.assert_drained()


def test_last_admitted_names_this_steps_admissions() -> None:
    """What the metrics read after each step: admissions from waiting, in the step of a long
    prompt's first chunk (not of its first token), once each."""
    d = Driver(num_blocks=32, max_num_batched_tokens=8, max_model_len=64, caching=False)
    d.add("long", prompt_of(20), max_tokens=2)
    d.add("short", prompt_of(4, salt=1), max_tokens=2)
    admitted: list[list[str]] = []
    while d.sched.has_unfinished():
        d.step()
        admitted.append([rid for rid, index in d.sched.last_admitted])
        assert d.sched.last_preempted == []
    assert admitted[0] == ["long"]  # the first 8 of its 20 tokens
    assert [rid for step in admitted for rid in step] == ["long", "short"]  # each once


def test_chunked_prefill_shares_the_budget_with_decodes() -> None:
    d = Driver(num_blocks=64, max_num_batched_tokens=6)
    d.add("short", prompt_of(3), t=0, max_tokens=8)
    d.step()
    d.add("long", prompt_of(30, salt=1), t=1, max_tokens=2)
    d.step()
    seqs = {s.seq_id: s.num_tokens for s in d.plans[-1].seqs}
    assert sorted(seqs.values()) == [1, 5]  # 1 decode + a 5-token chunk of the prompt
    d.run()
    assert d.outputs[("long", 0)] == d.expected("long", 0, 2)
    d.assert_drained()


# ---------------------------------------------------------------------- prefix cache


def test_prefix_hits_are_counted_and_skip_compute() -> None:
    d = Driver(num_blocks=64, block_size=4)
    shared = prompt_of(16)
    d.add("a", shared + [7, 8, 9], max_tokens=2)
    d.run()
    assert d.finished[("a", 0)].num_cached_tokens == 0
    d.add("b", shared + [5, 6], max_tokens=2)  # 18 tokens: 4 full shared blocks
    d.step()
    first = d.plans[-1].seqs[0]
    assert (first.start_pos, first.num_tokens) == (16, 2)
    d.run()
    assert d.finished[("b", 0)].num_cached_tokens == 16
    stats = d.sched.stats()
    assert stats.prefix_hit_tokens == 16
    assert stats.prefix_queried_tokens == 18 + 17
    d.assert_drained()


def test_prefix_hit_leaves_one_token_to_compute() -> None:
    d = Driver(num_blocks=64, block_size=4)
    p = prompt_of(16)
    d.add("a", p, max_tokens=1)
    d.run()
    d.add("b", p, max_tokens=1)  # all 4 blocks cached, but the last token must run
    d.step()
    first = d.plans[-1].seqs[0]
    assert (first.start_pos, first.num_tokens) == (12, 4)
    assert d.finished[("b", 0)].num_cached_tokens == 12
    assert d.outputs[("b", 0)] == d.expected("b", 0, 1)
    d.assert_drained()


def test_output_blocks_are_cached_too() -> None:
    d = Driver(num_blocks=64, block_size=4)
    p = prompt_of(6)
    d.add("a", p, max_tokens=10)
    d.run()
    out = d.outputs[("a", 0)]
    d.add("b", p + out[:9], max_tokens=1)  # 15 tokens = prompt + 9 outputs of "a"
    d.run()
    # The last output token was never computed, so blocks up to token 12 are cached.
    assert d.finished[("b", 0)].num_cached_tokens == 12
    d.assert_drained()


def test_cache_salt_shares_blocks_only_within_one_salt() -> None:
    d = Driver(num_blocks=64, block_size=4)
    prompt = prompt_of(17)  # 4 full blocks can hit (the last token is always computed)
    cached: dict[str, int] = {}
    for rid, salt in (("a", "tenant-a"), ("b", "tenant-b"), ("a2", "tenant-a"),
                      ("plain", None), ("plain2", None), ("b2", "tenant-b")):
        d.add(rid, prompt, max_tokens=2, cache_salt=salt)
        d.step()
        cached[rid] = d.plans[-1].seqs[0].start_pos  # computed on admission = the hit
        d.run()
        assert d.finished[(rid, 0)].num_cached_tokens == cached[rid]
        assert d.outputs[(rid, 0)] == d.expected(rid, 0, 2)
    # A different salt, or none, never hits a salted request's blocks (nor they its);
    # the same salt does.
    assert cached == {"a": 0, "b": 0, "a2": 16, "plain": 0, "plain2": 16, "b2": 16}
    assert d.sched.stats().prefix_hit_tokens == 3 * 16
    d.assert_drained()


def test_cache_salt_children_share_their_parents_salted_blocks() -> None:
    d = Driver(num_blocks=64, block_size=4, max_num_seqs=4)
    prompt = prompt_of(17)
    d.add("multi", prompt, n=3, max_tokens=3, cache_salt="s", temperature=1.0)
    d.run()
    d.add("same", prompt, max_tokens=1, cache_salt="s")
    d.add("other", prompt, max_tokens=1, cache_salt="t")
    d.run()
    assert d.finished[("same", 0)].num_cached_tokens == 16
    assert d.finished[("other", 0)].num_cached_tokens == 0
    d.assert_drained()


def test_prefix_caching_off_computes_everything() -> None:
    d = Driver(num_blocks=64, block_size=4, caching=False)
    d.add("a", prompt_of(16), max_tokens=1)
    d.run()
    d.add("b", prompt_of(16), max_tokens=1)
    d.step()
    assert d.plans[-1].seqs[0].num_tokens == 16
    assert d.finished[("b", 0)].num_cached_tokens == 0
    d.assert_drained()


# ---------------------------------------------------------------------- preemption


def tight_driver(policy: str = "fcfs") -> Driver:
    # 10 blocks of 4 = 40 tokens: three 8-token prompts fit (6 blocks), then decoding
    # needs a 3rd block each, and a 4th: someone must go.
    return Driver(
        num_blocks=10, block_size=4, max_model_len=40, policy=policy, caching=False,
        max_num_batched_tokens=64,
    )  # fmt: skip


def test_preemption_takes_the_newest_first() -> None:
    d = tight_driver()
    for i, rid in enumerate("abc"):
        d.add(rid, prompt_of(8, salt=i), t=i, max_tokens=12)
    victims: list[str] = []
    while d.sched.has_unfinished():
        before = d.sched.num_preemptions
        d.step()
        # What the metrics read: each of this step's preemptions, once.
        assert len(d.sched.last_preempted) == d.sched.num_preemptions - before
        if d.sched.num_preemptions > before:
            preempted = [s for s in d.sched.waiting if s.status is SequenceStatus.PREEMPTED]
            victims.extend(s.request_id for s in preempted if s.request_id not in victims)
    assert victims[0] == "c"
    assert "a" not in victims  # the oldest is never a victim while a newer one runs
    for i, rid in enumerate("abc"):  # identical token accounting despite recompute
        assert d.outputs[(rid, 0)] == d.expected(rid, 0, 12)
        assert d.finished[(rid, 0)].num_output_tokens == 12
    d.assert_drained()


def test_preemption_in_priority_mode_takes_lowest_priority() -> None:
    d = tight_driver("priority")
    d.add("high", prompt_of(8, 0), t=0, priority=0, max_tokens=12)
    d.add("low", prompt_of(8, 1), t=1, priority=9, max_tokens=12)
    d.add("mid", prompt_of(8, 2), t=2, priority=3, max_tokens=12)
    first_victim = None
    while d.sched.has_unfinished():
        d.step()
        if first_victim is None and d.sched.num_preemptions:
            first_victim = next(iter(d.sched.waiting)).request_id
    assert first_victim == "low"
    for rid in ("high", "low", "mid"):
        assert d.outputs[(rid, 0)] == d.expected(rid, 0, 12)
    d.assert_drained()


def two_running(policy: str, num_blocks: int, low_prompt: int, high_prompt: int) -> Driver:
    """"low" (priority 9) is admitted a step before "high" (priority 0), so running is
    [low, high]: the running loop reaches the low-priority sequence first."""
    d = Driver(num_blocks=num_blocks, block_size=4, max_model_len=4 * num_blocks,
               policy=policy, caching=False)
    d.add("low", prompt_of(low_prompt, 1), t=0, priority=9, max_tokens=8)
    d.step()
    d.add("high", prompt_of(high_prompt, 2), t=1, priority=0, max_tokens=8)
    d.step()
    assert [s.request_id for s in d.sched.running] == ["low", "high"]
    return d


def step_until_preemption(d: Driver) -> list[str]:
    """Steps until a step preempts; returns the request ids that step scheduled."""
    while not d.sched.num_preemptions:
        d.step()
    return [d.state[s.seq_id][0] for s in d.plans[-1].seqs]


def test_priority_victim_already_scheduled_this_step_gives_its_tokens_back() -> None:
    # 5 blocks: low (8 + outputs) holds 3, high (6 + outputs) 2. At high's 9th token no
    # block is free; low was scheduled earlier in the same step (its token fits its
    # block), yet it is the worst priority, so it is the victim, not the newer high.
    d = two_running("priority", num_blocks=5, low_prompt=8, high_prompt=6)
    assert step_until_preemption(d) == ["high"]  # low's scheduled tokens were taken back
    assert d.sched.last_preempted == [("low", 0)]
    assert [s.request_id for s in d.sched.running] == ["high"]
    d.run()
    for rid in ("low", "high"):
        assert d.outputs[(rid, 0)] == d.expected(rid, 0, 8)
    d.assert_drained()


def test_fcfs_victim_is_the_newest_arrival_whatever_its_priority() -> None:
    d = two_running("fcfs", num_blocks=5, low_prompt=8, high_prompt=6)
    assert step_until_preemption(d) == ["low"]
    assert d.sched.last_preempted == [("high", 0)]
    d.run()
    d.assert_drained()


def test_priority_victim_preempting_itself_lets_later_running_sequences_run() -> None:
    # 6 blocks: low reaches a block boundary first with none free; it is the worst
    # priority, so it preempts itself, and high (after it in running) still runs this step.
    d = two_running("priority", num_blocks=6, low_prompt=8, high_prompt=6)
    assert step_until_preemption(d) == ["high"]
    assert d.sched.last_preempted == [("low", 0)]
    d.run()
    for rid in ("low", "high"):
        assert d.outputs[(rid, 0)] == d.expected(rid, 0, 8)
    d.assert_drained()


def test_priority_victim_ties_break_by_latest_arrival() -> None:
    d = tight_driver("priority")
    d.add("first", prompt_of(8, 0), t=0, priority=5, max_tokens=12)
    d.add("second", prompt_of(8, 1), t=1, priority=5, max_tokens=12)
    d.add("best", prompt_of(8, 2), t=2, priority=1, max_tokens=12)
    step_until_preemption(d)
    assert d.sched.last_preempted == [("second", 0)]
    d.run()
    d.assert_drained()


def test_preempted_sequence_recomputes_prompt_and_outputs() -> None:
    d = tight_driver()
    for i, rid in enumerate("abc"):
        d.add(rid, prompt_of(8, salt=i), t=i, max_tokens=12)
    while not d.sched.num_preemptions:
        d.step()
    victim = next(s for s in d.sched.waiting if s.status is SequenceStatus.PREEMPTED)
    assert victim.num_computed_tokens == 0 and victim.block_ids == []
    n_out = victim.num_output_tokens
    assert n_out > 0
    while victim.status is not SequenceStatus.RUNNING:
        d.step()
    resumed = next(s for s in d.plans[-1].seqs if s.seq_id == victim.seq_id)
    assert resumed.start_pos == 0 and resumed.num_tokens == 8 + n_out  # prompt + outputs
    assert any(ns.seq_id == victim.seq_id and len(ns.output_token_ids) == n_out
               for ns in d.plans[-1].new_seqs)  # fmt: skip
    d.run()
    d.assert_drained()


def test_lone_sequence_is_never_preempted() -> None:
    d = Driver(num_blocks=10, block_size=4, max_model_len=40, caching=False)
    d.add("solo", prompt_of(30), max_tokens=10)  # grows to 40 tokens = the whole pool
    d.run()
    assert d.sched.num_preemptions == 0
    assert d.finished[("solo", 0)].finish_reason == "length"
    assert len(d.outputs[("solo", 0)]) == 10
    d.assert_drained()


def test_pool_must_hold_one_full_sequence() -> None:
    pool = llmcore.BlockPool(3, 4)
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(SchedulerConfig(max_model_len=13), KVManager(pool))


# ---------------------------------------------------------------------- stopping


def seq_of(max_model_len: int = 100, prompt: int = 4, **params: object) -> Sequence:
    sp = SamplingParams(**params)  # type: ignore[arg-type]
    return Sequence(0, "r", range(prompt), sp, max_model_len=max_model_len, eos_token_ids=(EOS,))


def test_stop_on_eos_and_ignore_eos() -> None:
    s = seq_of(max_tokens=10)
    assert not s.append_token(5)
    assert s.append_token(EOS)
    assert (s.finish_reason, s.stop_reason) == (FinishReason.STOP, None)
    assert s.output_token_ids == [5, EOS]
    s = seq_of(max_tokens=3, ignore_eos=True)
    assert not s.append_token(EOS) and not s.append_token(EOS)
    assert s.append_token(EOS) and s.finish_reason is FinishReason.LENGTH


def test_min_tokens_holds_back_eos_and_stop_ids() -> None:
    s = seq_of(max_tokens=10, min_tokens=2, stop_token_ids=[9])
    assert s.suppressed_token_ids() == (EOS, 9)
    assert not s.append_token(EOS)
    assert s.suppressed_token_ids() == (EOS, 9)
    assert not s.append_token(9)
    assert s.suppressed_token_ids() == ()
    assert s.append_token(9)
    assert (s.finish_reason, s.stop_reason) == (FinishReason.STOP, 9)
    assert seq_of(min_tokens=1, ignore_eos=True).suppressed_token_ids() == ()


def test_stop_token_ids_even_with_ignore_eos() -> None:
    s = seq_of(ignore_eos=True, stop_token_ids=[7])
    assert s.append_token(7) and s.stop_reason == 7


def test_stop_token_at_max_tokens_reports_stop() -> None:
    s = seq_of(max_tokens=2)
    assert not s.append_token(5)
    assert s.append_token(EOS) and s.finish_reason is FinishReason.STOP


def test_max_model_len_stops_and_max_tokens_none() -> None:
    s = seq_of(max_model_len=7, prompt=4, max_tokens=None)
    assert s.max_output_tokens == 3
    assert not s.append_token(5) and not s.append_token(5)
    assert s.append_token(5) and s.finish_reason is FinishReason.LENGTH
    s = seq_of(max_model_len=7, prompt=4, max_tokens=100)
    s.append_token(5), s.append_token(5)
    assert s.append_token(5) and s.num_tokens == 7


def test_stops_through_the_scheduler() -> None:
    d = Driver(num_blocks=64, max_model_len=20, eos_token_ids=(EOS,))
    d.planted[("eos", 0, 2)] = EOS
    d.planted[("early", 0, 0)] = EOS
    d.planted[("early", 0, 2)] = EOS
    d.planted[("tok", 0, 1)] = 777
    d.add("eos", prompt_of(5), max_tokens=10)
    d.add("ign", prompt_of(5), ignore_eos=True, max_tokens=4)
    d.add("early", prompt_of(5), min_tokens=2, max_tokens=10)
    d.add("tok", prompt_of(5), stop_token_ids=[777], max_tokens=10)
    d.add("ctx", prompt_of(15), max_tokens=None)
    d.run()
    f = d.finished
    assert (f[("eos", 0)].finish_reason, len(d.outputs[("eos", 0)])) == ("stop", 3)
    assert (f[("ign", 0)].finish_reason, len(d.outputs[("ign", 0)])) == ("length", 4)
    assert (f[("early", 0)].finish_reason, len(d.outputs[("early", 0)])) == ("stop", 3)
    assert (f[("tok", 0)].stop_reason, len(d.outputs[("tok", 0)])) == (777, 2)
    assert (f[("ctx", 0)].finish_reason, len(d.outputs[("ctx", 0)])) == ("length", 5)
    d.assert_drained()


def test_sampling_row_carries_min_tokens_ban() -> None:
    d = Driver(num_blocks=64, eos_token_ids=(EOS,))
    d.add("m", prompt_of(5), min_tokens=2, max_tokens=4, temperature=0.0)
    rows = []
    while d.sched.has_unfinished():
        d.step()
        rows.append(d.plans[-1].seqs[0].sample)
    assert [r.banned_token_ids for r in rows] == [(EOS,), (EOS,), (), ()]
    assert [r.position for r in rows] == [0, 1, 2, 3]
    assert all(r.temperature == 0.0 for r in rows)


# ---------------------------------------------------------------------- requests in


def test_add_request_rejects_what_can_never_run() -> None:
    d = Driver(max_model_len=16)
    with pytest.raises(ValueError, match="at least one token"):
        d.add("e", [])
    with pytest.raises(ValueError, match="max_model_len"):
        d.add("l", prompt_of(16))
    d.add("ok", prompt_of(15))
    with pytest.raises(ValueError, match="already in flight"):
        d.add("ok", prompt_of(3))


def test_schedule_twice_without_update_is_an_error() -> None:
    d = Driver()
    d.add("a", prompt_of(4))
    d.sched.schedule()
    with pytest.raises(RuntimeError):
        d.sched.schedule()


def test_fcfs_admits_in_arrival_order_and_priority_by_value() -> None:
    for policy, expect in (("fcfs", ["p5", "p0", "p9"]), ("priority", ["p0", "p5", "p9"])):
        d = Driver(num_blocks=64, max_num_seqs=1, policy=policy)
        for t, (rid, prio) in enumerate((("p5", 5), ("p0", 0), ("p9", 9))):
            d.add(rid, prompt_of(4, t), t=t, priority=prio, max_tokens=2)
        order: list[str] = []
        while d.sched.has_unfinished():
            for o in d.step():
                if o.request_id not in order:
                    order.append(o.request_id)
        assert order == expect, policy


def test_priority_admission_by_value_then_arrival_and_preempted_reenter_by_key() -> None:
    d = Driver(num_blocks=64, max_num_seqs=1, policy="priority")
    for t, (rid, prio) in enumerate((("a1", 1), ("b0", 0), ("c1", 1), ("d0", 0), ("e-3", -3))):
        d.add(rid, prompt_of(4, t), t=t, priority=prio, max_tokens=2)
    assert [s.request_id for s in d.sched.waiting] == ["e-3", "b0", "d0", "a1", "c1"]
    order: list[str] = []
    while d.sched.has_unfinished():
        order += [rid for rid, _ in d.sched.last_admitted if rid not in order]
        d.step()
    order += [rid for rid, _ in d.sched.last_admitted if rid not in order]
    assert order == ["e-3", "b0", "d0", "a1", "c1"]


def test_priority_preempted_sequence_waits_behind_better_priorities_only() -> None:
    d = tight_driver("priority")
    d.add("high", prompt_of(8, 0), t=0, priority=0, max_tokens=12)
    d.add("low", prompt_of(8, 1), t=1, priority=9, max_tokens=12)
    d.add("mid", prompt_of(8, 2), t=2, priority=3, max_tokens=12)
    step_until_preemption(d)
    assert d.sched.last_preempted == [("low", 0)]
    d.add("later-low", prompt_of(8, 3), t=3, priority=9, max_tokens=4)
    d.add("later-mid", prompt_of(8, 4), t=4, priority=3, max_tokens=4)
    # The victim keeps its arrival: ahead of a later arrival of its priority, behind a
    # better priority that arrived after it.
    assert [s.request_id for s in d.sched.waiting] == ["later-mid", "low", "later-low"]
    d.run()
    d.assert_drained()


# ---------------------------------------------------------------------- simulation


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_simulation(policy: str, seed: int) -> None:
    """Random arrivals, lengths, shared prefixes, n > 1 and aborts (of requests and of
    single choices, forked or not) on a tight pool: every choice ends once, with exactly
    its expected tokens unless aborted, and every block comes back."""
    rng = random.Random(seed)
    d = Driver(
        num_blocks=40, block_size=4, max_model_len=96, max_num_batched_tokens=24,
        max_num_seqs=6, policy=policy, eos_token_ids=(EOS,),
    )  # fmt: skip
    systems = [prompt_of(rng.randint(4, 20), salt=100 + i) for i in range(3)]
    want: dict[str, tuple[int, int]] = {}  # rid -> (n, max_tokens)
    arrival_step: dict[str, int] = {}
    aborted: set[str] = set()
    aborted_choices: set[tuple[str, int]] = set()
    waits: list[int] = []
    step = 0
    for k in range(60):
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            rid = f"q{k}-{len(want)}"
            prompt = rng.choice(systems) + prompt_of(rng.randint(1, 40), salt=rng.randrange(10**6))
            prompt = prompt[:80]
            n = rng.choice([1, 1, 1, 2, 3])
            max_tokens = rng.randint(1, 96 - len(prompt))
            if rng.random() < 0.1:
                d.planted[(rid, 0, rng.randrange(max_tokens))] = EOS
            d.add(rid, prompt, t=step, n=n, max_tokens=max_tokens, priority=rng.randint(0, 3))
            want[rid] = (n, max_tokens)
            arrival_step[rid] = step
        if rng.random() < 0.08 and d.sched.has_unfinished():
            live = [r for r in want if r not in aborted and (r, 0) not in d.finished]
            if live:
                victim = rng.choice(live)
                d.record(d.sched.abort(victim))
                aborted.add(victim)
        if rng.random() < 0.08:
            choices = [(r, i) for r, (n, _) in want.items() if r not in aborted
                       for i in range(n) if (r, i) not in d.finished]
            if choices:
                choice = rng.choice(choices)
                d.record(d.sched.abort(*choice))
                aborted_choices.add(choice)
        for o in d.step():
            if o.num_output_tokens == 1 and o.new_token_ids:
                waits.append(step - arrival_step[o.request_id])
        step += 1
    step += d.run(max_steps=5000)

    assert d.sched.num_preemptions > 0, "the pool should be tight enough to preempt"
    assert aborted_choices
    for rid, (n, max_tokens) in want.items():
        for i in range(n):
            out = d.finished[(rid, i)]  # everyone finished: nobody starved
            if rid in aborted or (rid, i) in aborted_choices:
                continue
            toks = d.outputs[(rid, i)]
            eos_at = [p for (r, j, p) in d.planted if (r, j) == (rid, i)]
            expect_len = min([max_tokens] + [p + 1 for p in eos_at])
            assert toks == d.expected(rid, i, expect_len), (rid, i)
            assert out.finish_reason == ("stop" if toks[-1] == EOS else "length")
    assert max(waits) < 200
    print(f"{policy} seed={seed}: {step} steps, {d.sched.num_preemptions} preemptions, "
          f"max wait to first token {max(waits)} steps, "
          f"prefix hits {d.sched.stats().prefix_hit_tokens} tokens")  # fmt: skip
    d.assert_drained()


def test_no_token_from_the_sampler_ends_the_sequence() -> None:
    d = Driver(num_blocks=16)
    d.add("masked", prompt_of(5), max_tokens=8, n=2)
    d.planted[("masked", 0, 0)] = -1
    d.run()
    assert d.finished[("masked", 0)].finish_reason == "stop"
    assert d.outputs[("masked", 0)] == []
    assert d.outputs[("masked", 1)] == d.expected("masked", 1, 8)  # siblings still forked
    d.assert_drained()


def test_prompt_logprobs_once_despite_chunks_preemption_and_cache() -> None:
    """Chunks deliver pieces, recompute after preemption scores some tokens twice, n > 1
    forks after the first token: each request still gets its prompt's logprobs exactly
    once, whole and in order; and a request asking for them takes no prefix-cache hit."""
    d = Driver(num_blocks=10, block_size=4, max_model_len=40, caching=False,
               max_num_batched_tokens=5)
    for i, rid in enumerate("abc"):
        d.add(rid, prompt_of(9, salt=i), t=i, max_tokens=12, prompt_logprobs=1,
              n=2 if rid == "b" else 1)
    d.run()
    assert d.sched.num_preemptions > 0
    for rid in "abc":
        got = d.prompt_lps[rid]
        assert got[0] is None and [e.logprob for e in got[1:]] == [-float(p) for p in range(1, 9)]

    d = Driver(num_blocks=32, block_size=4)
    d.add("warm", prompt_of(13), max_tokens=2)
    d.run()
    d.add("plp", prompt_of(13), max_tokens=2, prompt_logprobs=0)
    d.add("hit", prompt_of(13), max_tokens=2)
    d.step()
    by_id = {s.seq_id: s for s in d.plans[-1].seqs}
    starts = sorted(s.start_pos for s in by_id.values())
    assert starts == [0, 12]  # plp computes from 0; hit reuses 3 cached blocks
    d.run()
    assert len(d.prompt_lps["plp"]) == 13 and "hit" not in d.prompt_lps

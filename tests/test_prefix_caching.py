"""Prefix caching in the scheduler, the engine and the server.

The rule under test: every full block is named by its tokens chained to its parent's key; a
(re)admitted request takes its leading cached full blocks but never the block holding its
last token, so it takes `(num_tokens - 1) // block_size` of them at most; blocks are offered
to the cache as the row that fills them is decided; a block nobody holds stays cached (LRU,
a freed table tail first) until the pool needs it. Every step is followed by the integrity
checks, which compare each block's refcount with the block tables naming it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pool_helpers import num_evictable, num_keyed
from server_helpers import MODEL_NAME, served

import llmengine
from llmengine.cli import build_parser, main
from llmengine.engine import Engine
from llmengine.kv.prefix_cache import prefix_keys
from llmengine.outcome import IterationOutcome
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import ScheduledRow, Scheduler, SchedulerOutput

FAKE_TOKEN = 7
BS = 4  # the scheduler tests' block size


def make_request(request_id: int, tokens: list[int], max_tokens: int) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=list(tokens),
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival=request_id,
        block_size=BS,
    )


def caching_scheduler(num_blocks: int, num_slots: int = 4, **options: Any) -> Scheduler:
    return Scheduler(
        num_blocks=num_blocks,
        block_size=BS,
        num_slots=num_slots,
        enable_prefix_caching=True,
        **options,
    )


def check_keys(scheduler: Scheduler) -> None:
    """Every keyed block in a running request's table holds that request's tokens there, and
    every block it shares with another request is one whose positions it has computed."""
    if not scheduler.config.enable_prefix_caching:
        return
    pool = scheduler.pool
    for request in scheduler.running:
        keys = prefix_keys(request.token_ids, scheduler.block_size)
        table = request.block_table
        for index, block_id in enumerate(table.block_ids):
            key = pool.key_of(block_id)
            assert key is None or key == keys[index], f"request {request.request_id} block {index}"
            if pool.refcount(block_id) > 1:
                assert (index + 1) * scheduler.block_size <= table.num_tokens


class FakeForward:
    """A forward over plain integers, with a stand-in for the KV cache that checks every read.

    Each cache position holds the tokens whose K/V the real forward would leave there (the
    sequence up to and including that position), on the device and in the host swap space.
    A step carries out the decision like the engine (swaps out, swaps in, every row's writes,
    then every row's reads) and checks that each row reads, at each of its positions, K/V of
    its own tokens: a block shared too early, overwritten, or evicted while in use would show.
    The integrity checks run before and after the update.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.device: dict[tuple[int, int], tuple[int, ...]] = {}
        self.host: dict[tuple[int, int], tuple[int, ...]] = {}

    def step(self) -> SchedulerOutput:
        scheduler, size = self.scheduler, self.scheduler.block_size
        out = scheduler.schedule()
        scheduler.check_integrity()
        for source, target, moves in (
            (self.device, self.host, out.blocks_to_swap_out),
            (self.host, self.device, out.blocks_to_swap_in),
        ):
            for from_block, to_block in moves:
                for offset in range(size):
                    target[to_block, offset] = source.get((from_block, offset), ())
        for row in out.rows:
            for position in range(row.start_position, row.end_position):
                block, offset = row.request.block_table.location_of(position)
                self.device[block, offset] = tuple(row.request.token_ids[: position + 1])
        for row in out.rows:
            for position in range(row.end_position):
                block, offset = row.request.block_table.location_of(position)
                assert self.device.get((block, offset)) == tuple(
                    row.request.token_ids[: position + 1]
                ), f"request {row.request.request_id} reads wrong K/V at position {position}"
        tokens = {row.request.request_id: FAKE_TOKEN for row in out.rows if row.samples}
        scheduler.update(out, tokens)
        scheduler.check_integrity()
        check_keys(scheduler)
        return out


def row_of(out: SchedulerOutput, request: Request) -> ScheduledRow:
    (row,) = [row for row in out.rows if row.request is request]
    return row


def prompt(start: int, length: int) -> list[int]:
    """`length` distinct tokens from `start` on; prompts from distant starts share none."""
    return list(range(start, start + length))


# -- the scheduler: what an admission takes ----------------------------------------------------


def test_a_later_request_takes_the_shared_full_blocks_of_a_prefilled_one() -> None:
    scheduler = caching_scheduler(num_blocks=32)
    forward = FakeForward(scheduler)
    shared = prompt(100, 2 * BS)
    first = make_request(0, shared + [1, 2], max_tokens=5)
    second = make_request(1, shared + [3, 4, 5], max_tokens=5)
    scheduler.add(first)
    out = forward.step()
    assert row_of(out, first).cached == 0
    scheduler.add(second)
    out = forward.step()
    row = row_of(out, second)
    assert out.admitted == [second]
    assert (row.start_position, row.num_positions, row.cached) == (2 * BS, 3, 2 * BS)
    taken = second.block_table.block_ids[:2]
    assert taken == first.block_table.block_ids[:2]
    assert [scheduler.pool.refcount(b) for b in taken] == [2, 2]
    # Its third block holds its own tokens: a block of its own, held by it alone.
    assert second.block_table.block_ids[2] != first.block_table.block_ids[2]
    assert scheduler.pool.refcount(second.block_table.block_ids[2]) == 1


@pytest.mark.parametrize("num_full", [1, 2, 3])
def test_a_prompt_of_whole_blocks_takes_all_but_its_last_block(num_full: int) -> None:
    scheduler = caching_scheduler(num_blocks=32)
    forward = FakeForward(scheduler)
    tokens = prompt(100, num_full * BS)
    first, second = make_request(0, tokens, 4), make_request(1, tokens, 4)
    scheduler.add(first)
    forward.step()
    assert all(scheduler.pool.key_of(b) for b in first.block_table.block_ids[:num_full])
    scheduler.add(second)
    row = row_of(forward.step(), second)
    # Its last block is cached too, but the prefill must compute its last position.
    assert row.cached == (num_full - 1) * BS == row.start_position
    assert row.num_positions == BS
    assert second.block_table.block_ids[num_full - 1] != first.block_table.block_ids[num_full - 1]


def test_a_partial_block_is_never_shared_until_it_is_full() -> None:
    scheduler = caching_scheduler(num_blocks=32)
    forward = FakeForward(scheduler)
    tokens = prompt(100, BS + 2)  # one full block and half of a second
    first = make_request(0, tokens, max_tokens=8)
    scheduler.add(first)
    forward.step()  # the prefill: 6 positions, then one sampled token
    assert scheduler.pool.key_of(first.block_table.block_ids[1]) is None
    partial_twin = make_request(1, tokens + [FAKE_TOKEN, 9, 9], max_tokens=2)
    scheduler.add(partial_twin)
    row = row_of(forward.step(), partial_twin)
    assert row.cached == BS  # the partial block was still being filled when it was admitted
    # The next decode computes the first request's position 7: its second block is full, and
    # cached under its generated tokens, which a prompt that agrees with them takes.
    forward.step()
    assert scheduler.pool.key_of(first.block_table.block_ids[1]) is not None
    generated_twin = make_request(2, first.token_ids[: 2 * BS] + [9], max_tokens=2)
    scheduler.add(generated_twin)
    row = row_of(forward.step(), generated_twin)
    assert row.cached == 2 * BS
    assert generated_twin.block_table.block_ids[:2] == first.block_table.block_ids[:2]


@pytest.mark.parametrize("n", [2, 3])
def test_identical_prompts_admitted_in_one_step_share_the_blocks_the_first_one_fills(
    n: int,
) -> None:
    scheduler = caching_scheduler(num_blocks=32)
    forward = FakeForward(scheduler)
    tokens = prompt(100, 2 * BS + 3)
    requests = [make_request(i, tokens, max_tokens=3) for i in range(n)]
    for request in requests:
        scheduler.add(request)
    out = forward.step()
    assert out.admitted == requests
    assert [row.cached for row in out.rows] == [0] + [2 * BS] * (n - 1)
    assert [row.start_position for row in out.rows] == [0] + [2 * BS] * (n - 1)
    shared = requests[0].block_table.block_ids[:2]
    assert all(r.block_table.block_ids[:2] == shared for r in requests)
    assert [scheduler.pool.refcount(b) for b in shared] == [n, n]
    assert len({r.block_table.block_ids[2] for r in requests}) == n


def test_blocks_stay_cached_after_everyone_finishes_and_a_new_request_hits_them() -> None:
    scheduler = caching_scheduler(num_blocks=16)
    forward = FakeForward(scheduler)
    shared = prompt(100, 2 * BS)
    requests = [
        make_request(i, shared + prompt(200 + 10 * i, i + 1), max_tokens=4) for i in range(3)
    ]
    for request in requests:
        scheduler.add(request)
    for _ in range(20):
        if not scheduler.has_unfinished():
            break
        forward.step()
    assert not scheduler.has_unfinished()
    pool = scheduler.pool
    assert pool.num_free == pool.num_blocks and pool.num_held == 0
    assert num_evictable(pool) > 0 and num_evictable(pool) == num_keyed(pool)
    late = make_request(3, shared + [1], max_tokens=2)
    scheduler.add(late)
    assert row_of(forward.step(), late).cached == 2 * BS


def test_the_older_finished_request_is_evicted_first_and_a_table_tail_before_its_prefix() -> None:
    scheduler = caching_scheduler(num_blocks=4, num_slots=1)
    forward = FakeForward(scheduler)
    pool = scheduler.pool

    def cached_run(request: Request) -> list[int]:
        return pool.lookup(prefix_keys(request.prompt_token_ids, BS))

    older, newer = make_request(0, prompt(100, 2 * BS), 1), make_request(1, prompt(200, 2 * BS), 1)
    for request in (older, newer):
        scheduler.add(request)
        forward.step()  # its prefill samples its only token: it is done
        assert request.state is RequestState.FINISHED
    older_table, newer_table = cached_run(older), cached_run(newer)
    assert len(older_table) == len(newer_table) == 2
    assert pool.num_free == num_evictable(pool) == 4  # nothing truly free: allocation evicts
    # Partial prompts, so the newcomers' own blocks are never cached.
    scheduler.add(make_request(2, prompt(300, BS - 1), 1))
    forward.step()
    assert pool.evictions == 1
    assert cached_run(older) == older_table[:1] and cached_run(newer) == newer_table
    # Three blocks: the one the last newcomer freed, then two evictions.
    scheduler.add(make_request(3, prompt(400, 3 * BS - 1), 1))
    forward.step()
    assert pool.evictions == 3
    assert cached_run(older) == [] and cached_run(newer) == newer_table[:1]


def test_an_evictable_hit_costs_a_free_block_at_admission() -> None:
    """Taking an evictable block removes it from the free count, so the check must pay for
    it: with a watermark of 1 the admission below would leave 0 free blocks."""
    for watermark in (1, 0):
        scheduler = caching_scheduler(num_blocks=6, watermark=watermark)
        forward = FakeForward(scheduler)
        shared = prompt(100, 2 * BS)
        done_at_once = make_request(0, shared, max_tokens=1)  # leaves 2 evictable blocks
        holder = make_request(1, prompt(200, 2 * BS + 2), max_tokens=2)  # holds 3 blocks
        for request in (done_at_once, holder):
            scheduler.add(request)
        forward.step()
        pool = scheduler.pool
        assert (pool.num_free, num_evictable(pool)) == (3, 2)
        # Its 3 blocks: the 2 evictable hits, 1 bought; 3 - 2 - 1 = 0 blocks left free.
        late = make_request(2, shared + prompt(300, BS), max_tokens=1)
        scheduler.add(late)
        out = forward.step()
        if watermark:
            assert late.state is RequestState.WAITING and late not in out.admitted
            assert holder.state is RequestState.FINISHED
            out = forward.step()
        assert out.admitted == [late] and row_of(out, late).cached == 2 * BS


def test_a_hit_another_request_holds_costs_nothing_at_admission() -> None:
    scheduler = caching_scheduler(num_blocks=4)
    forward = FakeForward(scheduler)
    shared = prompt(100, 2 * BS)
    first = make_request(0, shared + [1], max_tokens=3)
    scheduler.add(first)
    forward.step()
    assert scheduler.pool.num_free == 1
    # It needs 3 blocks, 2 of them held by the first request: the one free block is enough.
    second = make_request(1, shared + [2], max_tokens=3)
    scheduler.add(second)
    out = forward.step()
    assert out.admitted == [second] and row_of(out, second).cached == 2 * BS
    assert scheduler.pool.num_free == 0 and not out.preempted


@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_the_door_check_ignores_the_cache(enable_prefix_caching: bool) -> None:
    scheduler = Scheduler(
        num_blocks=4, block_size=BS, num_slots=2, enable_prefix_caching=enable_prefix_caching
    )
    forward = FakeForward(scheduler)
    shared = prompt(100, 3 * BS)
    scheduler.add(make_request(0, shared, max_tokens=1))
    forward.step()
    # Its prompt is cached all but the last position, yet its worst case is 5 blocks.
    with pytest.raises(ValueError, match="needs up to 5 blocks"):
        scheduler.add(make_request(1, shared + [1], max_tokens=4))
    scheduler.add(make_request(2, shared + [1], max_tokens=3))  # exactly the pool


def test_a_corrupted_refcount_is_caught() -> None:
    scheduler = caching_scheduler(num_blocks=16)
    forward = FakeForward(scheduler)
    tokens = prompt(100, 2 * BS + 1)
    for request_id in range(2):
        scheduler.add(make_request(request_id, tokens, max_tokens=4))
    forward.step()
    shared = scheduler.running[0].block_table.block_ids[0]
    own = scheduler.running[0].block_table.block_ids[2]
    assert scheduler.pool.refcount(shared) == 2
    for block_id, delta in ((shared, -1), (shared, 1), (own, 1)):
        scheduler.pool._refcount[block_id] += delta
        with pytest.raises(AssertionError, match="refcounts disagree"):
            scheduler.check_integrity()
        scheduler.pool._refcount[block_id] -= delta
        scheduler.check_integrity()


def test_a_victim_resumes_from_its_own_blocks_that_survived_in_the_cache() -> None:
    """The youngest is preempted by recompute at once; the oldest's growth then evicts the
    tail of its table, so only its first block is left when it comes back."""
    scheduler = caching_scheduler(num_blocks=5, num_slots=2)
    forward = FakeForward(scheduler)
    oldest = make_request(0, prompt(100, 2 * BS), max_tokens=6)  # grows to 4 blocks
    victim = make_request(1, prompt(200, 2 * BS), max_tokens=3)
    for request in (oldest, victim):
        scheduler.add(request)
    forward.step()
    victim_blocks = list(victim.block_table.block_ids)
    out = forward.step()
    assert out.preempted == [victim] and victim.state is RequestState.WAITING
    resumed = None
    for _ in range(10):
        out = forward.step()
        if victim in out.admitted:
            resumed = row_of(out, victim)
            break
    assert resumed is not None and oldest.state is RequestState.FINISHED
    assert victim.block_table.block_ids[0] == victim_blocks[0]
    assert resumed.cached == BS == resumed.start_position
    # It computes everything else again, and only that counts as recomputed.
    assert resumed.num_positions == resumed.recomputed == victim.num_tokens - 1 - BS


# -- the scheduler: random workloads ----------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"preemption": "swap", "swap_blocks": 6},
        {"max_num_batched_tokens": 6},
        {"policy": "reserve"},
        {"watermark": 1},
    ],
    ids=["recompute", "swap", "budget", "reserve", "watermark"],
)
@pytest.mark.parametrize("seed", range(4))
def test_random_shared_prefix_workloads_keep_every_invariant(options: dict, seed: int) -> None:
    rng = random.Random(seed)
    prefixes = [prompt(100, 3 * BS), prompt(100, BS) + prompt(500, 2 * BS), prompt(900, 5)]
    scheduler = caching_scheduler(num_blocks=12, num_slots=3, **options)
    forward = FakeForward(scheduler)
    requests = [
        make_request(
            i,
            rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 7))],
            max_tokens=rng.randrange(1, 12),
        )
        for i in range(16)
    ]
    pending = list(requests)
    cached = preempted = swapped = 0
    for _ in range(500):
        if not (pending or scheduler.has_unfinished()):
            break
        for _ in range(rng.randrange(0, 3)):
            if pending:
                scheduler.add(pending.pop(0))
        if not scheduler.has_unfinished():
            continue
        out = forward.step()
        preempted += len(out.preempted)
        swapped += len(out.swapped_out)
        for row in out.rows:
            if row.request in out.admitted:
                tokens_then = row.request.num_tokens - row.samples  # before the update
                assert row.start_position == row.cached <= (tokens_then - 1) // BS * BS
                cached += row.cached
            else:
                assert row.cached == 0
    assert not pending and not scheduler.has_unfinished()
    assert [r.num_output_tokens for r in requests] == [r.params.max_tokens for r in requests]
    assert scheduler.pool.num_free == scheduler.pool.num_blocks
    assert scheduler.swap.num_free == scheduler.swap.num_blocks
    assert cached > 0
    # The pool is small enough that every policy but "reserve" preempts, and swap swaps.
    assert (preempted > 0) == (options.get("policy") != "reserve")
    assert (swapped > 0) == ("swap_blocks" in options)


# -- the engine on real weights ---------------------------------------------------------------

ENGINE_BS = 8
OWN_LENGTHS = (1, 20, 7, 13, 4, 16, 9, 2, 18, 11)
POOLS = {
    "roomy": {"num_blocks": 128},
    "cramped": {"num_blocks": 14},
    "swap": {"num_blocks": 14, "preemption": "swap", "swap_blocks": 16},
    "budget": {"num_blocks": 14, "max_num_batched_tokens": 16},
    "reserve": {"num_blocks": 24, "policy": "reserve"},
}
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


class RecordingScheduler(Scheduler):
    """A scheduler that notes, for each admission row, what it computes and what it takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (start, positions computed, cached, recomputed, tokens, tokens lost to a preemption
        # by recompute), each as the row was decided.
        self.admissions: list[tuple[int, int, int, int, int, int]] = []

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        self.admissions += [
            (
                row.start_position,
                row.num_positions,
                row.cached,
                row.recomputed,
                row.request.num_tokens,
                row.request.num_discarded_tokens,
            )
            for row in out.rows
            if row.request in out.admitted
        ]
        return out


class RecordingEngine(Engine):
    scheduler_class = RecordingScheduler


@pytest.fixture(scope="module")
def system_prompts(model: llmengine.Llama) -> list[list[int]]:
    """Two 40-token system prompts that agree on their first 16 tokens (two blocks)."""
    rng = random.Random(3)
    first = [rng.randrange(1, model.config.vocab_size) for _ in range(40)]
    return [first, first[:16] + [rng.randrange(1, model.config.vocab_size) for _ in range(24)]]


@pytest.fixture(scope="module")
def prompts(model: llmengine.Llama, system_prompts: list[list[int]]) -> list[list[int]]:
    """Each request: one of the system prompts, then 1 to 20 tokens of its own."""
    rng = random.Random(4)
    vocab = model.config.vocab_size
    return [
        system_prompts[index % 3 == 0] + [rng.randrange(1, vocab) for _ in range(length)]
        for index, length in enumerate(OWN_LENGTHS)
    ]


def run(
    model: llmengine.Llama,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    enable_prefix_caching: bool,
    **pool: Any,
) -> tuple[list[list[int]], list[IterationOutcome], RecordingEngine]:
    """Run to completion, integrity checked every step; outputs, outcomes and the engine.

    Checks every admission row against the rule: it starts at its cached positions, whole
    blocks that never include its last token, and without a budget computes all the rest; a
    resumed one counts as recomputed only the lost positions it computes, not those cached.
    """
    engine = RecordingEngine(
        model,
        block_size=ENGINE_BS,
        num_slots=4,
        enable_prefix_caching=enable_prefix_caching,
        **pool,
    )
    ids = engine.add_requests(prompts, params)
    outcomes = []
    for _ in range(500):
        if not engine.has_unfinished():
            break
        outcomes.append(engine.step())
        engine.check_integrity()
    assert not engine.has_unfinished()
    assert engine.num_free_blocks == engine.num_blocks
    assert engine.num_free_swap_blocks == engine.num_swap_blocks
    admissions = engine.scheduler.admissions
    assert len(admissions) == sum(len(o.admitted) for o in outcomes)
    for start, positions, cached, recomputed, num_tokens, lost in admissions:
        assert start == cached and cached % ENGINE_BS == 0
        assert cached <= (num_tokens - 1) // ENGINE_BS * ENGINE_BS
        assert recomputed == max(0, min(start + positions, lost) - cached)
        if pool.get("max_num_batched_tokens") is None:
            assert positions + cached == num_tokens
            assert not lost or recomputed == positions  # a decoding victim lost every token
    assert sum(o.cached_tokens for o in outcomes) == sum(a[2] for a in admissions)
    outputs = [engine.release(request_id).output_token_ids for request_id in ids]
    return outputs, outcomes, engine


def forward_tokens(outcomes: list[IterationOutcome]) -> int:
    return sum(o.forward_tokens for o in outcomes)


@pytest.mark.parametrize("pool", POOLS)
def test_greedy_text_is_the_same_with_and_without_prefix_caching(
    model: llmengine.Llama, prompts: list[list[int]], pool: str
) -> None:
    reference, _, _ = run(model, prompts, GREEDY, False, **POOLS["roomy"])
    off, off_outcomes, _ = run(model, prompts, GREEDY, False, **POOLS[pool])
    on, on_outcomes, engine = run(model, prompts, GREEDY, True, **POOLS[pool])
    assert on == off == reference
    assert num_evictable(engine.scheduler.pool) > 0  # kept after everyone finished
    cached = sum(o.cached_tokens for o in on_outcomes)
    assert cached > 0 and forward_tokens(on_outcomes) < forward_tokens(off_outcomes)
    evictions = [sum(len(o.evicted) for o in outcomes) for outcomes in (off_outcomes, on_outcomes)]
    if pool in ("roomy", "reserve"):
        assert evictions == [0, 0]
        # The same rows, less what the cache gave: each cached position is one not computed.
        assert forward_tokens(off_outcomes) - forward_tokens(on_outcomes) == cached
    else:
        assert evictions[1] > 0, "the cramped pool preempts with caching on"
    if pool == "swap":
        assert sum(len(o.swapped_out) for o in on_outcomes) > 0
    if pool == "budget":
        assert all(o.forward_tokens <= 16 for o in on_outcomes)
        assert any(len(o.row_positions) > len(o.tokens) for o in on_outcomes), "chunked"


def test_seeded_sampling_is_the_same_with_and_without_prefix_caching(
    model: llmengine.Llama, prompts: list[list[int]]
) -> None:
    params = [
        SamplingParams(max_tokens=8, temperature=0.8, seed=seed, ignore_eos=True)
        for seed in range(len(prompts))
    ]
    reference, _, _ = run(model, prompts, params, False, **POOLS["roomy"])
    assert len({tuple(tokens) for tokens in reference}) == len(prompts)
    for pool in ("roomy", "cramped"):
        outputs, outcomes, _ = run(model, prompts, params, True, **POOLS[pool])
        assert outputs == reference, pool
        assert sum(o.cached_tokens for o in outcomes) > 0


def test_the_cached_tokens_are_what_the_rule_predicts(
    model: llmengine.Llama, system_prompts: list[list[int]]
) -> None:
    system = system_prompts[0]  # 40 tokens: 5 full blocks
    rng = random.Random(6)
    own = [rng.randrange(1, model.config.vocab_size) for _ in range(20)]
    engine = Engine(model, num_blocks=64, block_size=ENGINE_BS, enable_prefix_caching=True)
    cached = []
    # One step: the system prompt alone fills and offers its 5 blocks; a request with 1 more
    # token may take all 5, one with 20 more too (its 6th block is its own).
    engine.add_requests([system, system + own[:1], system + own], GREEDY)
    outcome = engine.step()
    cached.append(outcome.cached_tokens)
    assert len(outcome.admitted) == 3
    while engine.has_unfinished():
        cached.append(engine.step().cached_tokens)
    # After everyone finished: the system prompt again may take all but its last block.
    engine.add_request(system, GREEDY)
    cached.append(engine.step().cached_tokens)
    assert cached[0] == 0 + 5 * ENGINE_BS + 5 * ENGINE_BS
    assert sum(cached[1:-1]) == 0
    assert cached[-1] == 4 * ENGINE_BS


def test_a_resumption_that_recomputes_nothing_is_still_a_resumption(
    model: llmengine.Llama,
) -> None:
    """A victim evicted mid-prefill on a block boundary finds all it had computed cached.

    The oldest request's growth evicts the youngest after 4 of its 5 prompt positions, one
    full block, which stays cached while it waits: it resumes at position 4, recomputing
    nothing, and `outcome.resumed` must name it all the same.
    """
    prompts = [[11, 12, 13, 14], [21, 22, 23, 24, 25]]
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=1)]
    options = {"num_blocks": 4, "block_size": 4, "num_slots": 2, "max_num_batched_tokens": 2}
    engine = Engine(model, enable_prefix_caching=True, **options)
    victim = engine.add_requests(prompts, params)[1]
    outcomes = [engine.step() for _ in range(20) if engine.has_unfinished()]
    assert not engine.has_unfinished()
    (eviction,) = [o for o in outcomes if victim in o.evicted]
    assert not eviction.swapped_out
    admission, resumption = [o for o in outcomes if victim in o.admitted]
    assert (resumption.cached_tokens, resumption.recomputed_tokens) == (4, 0)
    assert victim not in admission.resumed and victim in resumption.resumed
    outputs = [engine.release(request_id).output_token_ids for request_id in (0, 1)]
    assert outputs == Engine(model, **options).generate(prompts, params)


# -- the server ---------------------------------------------------------------------------------


def test_serve_takes_enable_prefix_caching_to_the_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser().parse_args(["serve"]).enable_prefix_caching is False
    assert build_parser().parse_args(["serve", "--enable-prefix-caching"]).enable_prefix_caching

    def refuse(*args: Any, enable_prefix_caching: bool, **kwargs: Any) -> None:
        raise ValueError(f"the engine got enable_prefix_caching={enable_prefix_caching}")

    # The flag reaches the engine before any server runs: one that refuses ends the command.
    # Built in this process (--no-engine-process), where the refusing engine is patched in.
    monkeypatch.setattr(llmengine, "Engine", refuse)
    for argv, value in ((["--enable-prefix-caching"], True), ([], False)):
        assert main(["serve", "--no-engine-process", *argv]) == 2
        assert f"enable_prefix_caching={value}" in capsys.readouterr().err


def served_completion(
    model: llmengine.Llama, tokenizer: Any, prompt: list[int], enable_prefix_caching: bool
) -> tuple[list[str], dict[str, float]]:
    """One greedy completion with n=4 from a served engine: the texts, then /metrics."""
    engine = Engine(
        model,
        num_blocks=64,
        block_size=ENGINE_BS,
        num_slots=4,
        enable_prefix_caching=enable_prefix_caching,
    )
    with served(engine, tokenizer) as server:
        result = server.openai().completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0, n=4
        )
        metrics = server.metrics()
    return [choice.text for choice in result.choices], metrics


def test_the_samples_of_one_served_request_share_its_prompt_blocks(
    model: llmengine.Llama, tokenizer: Any, system_prompts: list[list[int]]
) -> None:
    prompt = system_prompts[0]
    offline = Engine(model, num_blocks=64, block_size=ENGINE_BS)
    (tokens,) = offline.generate([prompt], SamplingParams(max_tokens=8))
    expected = tokenizer.decode(tokens, skip_special_tokens=True)
    texts, metrics = served_completion(model, tokenizer, prompt, True)
    assert texts == [expected] * 4
    # The 4 samples are admitted in one step: the first offers all its full blocks, the other
    # 3 take every one but the block holding the last prompt token.
    shared_blocks = (len(prompt) - 1) // ENGINE_BS
    hits = metrics["llmengine_prefix_cache_hit_tokens_total"]
    assert hits == 3 * shared_blocks * ENGINE_BS
    texts_off, metrics_off = served_completion(model, tokenizer, prompt, False)
    assert texts_off == texts and metrics_off["llmengine_prefix_cache_hit_tokens_total"] == 0
    forward = metrics["llmengine_forward_tokens_total"]
    assert metrics_off["llmengine_forward_tokens_total"] - forward == hits

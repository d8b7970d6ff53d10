"""The scheduler over plain integers: allocation, victims, queue order, the door, the seeds.

No model and no tensors: a "forward" here samples token 7 for every row. Every test calls the
integrity check after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import seed_tables as seeds

from llmengine.kv.blocks import blocks_for_length
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import Scheduler, SchedulerOutput


def make_request(request_id: int, prompt_len: int, max_tokens: int, block_size: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(
        request_id=request_id,
        prompt_token_ids=[1] * prompt_len,
        params=params,
        arrival=request_id,
        block_size=block_size,
    )


@dataclass
class Run:
    iterations: int
    tokens: int
    preemptions: int
    recomputed: int
    forward_tokens: int
    latency: dict[int, int]
    evictions: dict[int, int]


def drive(scheduler: Scheduler, requests: list[Request]) -> Run:
    """Run the scheduler to completion, one fake forward per iteration."""
    for request in requests:
        scheduler.add(request)
    run = Run(0, 0, 0, 0, 0, {}, {r.request_id: 0 for r in requests})
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        scheduler.check_integrity()
        assert out.rows, "unfinished requests, yet nothing scheduled"
        for victim in out.preempted:
            run.evictions[victim.request_id] += 1
        run.preemptions += len(out.preempted)
        run.iterations += 1
        run.recomputed += sum(row.recomputed for row in out.rows)
        run.forward_tokens += sum(row.num_positions for row in out.rows)
        run.tokens += len(out.rows)
        finished = scheduler.update(out, {row.request.request_id: 7 for row in out.rows})
        for request in finished:
            run.latency[request.request_id] = run.iterations
        scheduler.check_integrity()
    assert scheduler.pool.num_free == scheduler.pool.num_blocks
    assert scheduler.swap.num_free == scheduler.swap.num_blocks
    assert len(scheduler.free_slots) == scheduler.num_slots
    return run


def uniform_burst(n: int, prompt_len: int, max_tokens: int, block_size: int) -> list[Request]:
    return [make_request(i, prompt_len, max_tokens, block_size) for i in range(n)]


# -- the rounding rule and the pool ------------------------------------------------------


def test_blocks_for_length_rounds_up() -> None:
    assert [blocks_for_length(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError):
        blocks_for_length(3, 0)


# -- allocation per state ----------------------------------------------------------------


def test_fresh_request_needs_its_prompts_blocks() -> None:
    scheduler = Scheduler(num_blocks=16, block_size=4, num_slots=2)
    assert scheduler.blocks_needed_for(make_request(0, 9, 8, 4)) == 3


def test_running_request_needs_a_block_only_when_crossing_a_boundary() -> None:
    scheduler = Scheduler(num_blocks=16, block_size=4, num_slots=1)
    request = make_request(0, 4, 8, 4)
    scheduler.add(request)
    needs = []
    for _ in range(6):
        out = scheduler.schedule()
        needs.append(len(request.block_table.block_ids))
        scheduler.update(out, {0: 7})
    # Prompt of 4 fills one block; the first generated token's position (4) needs a second.
    assert needs == [1, 2, 2, 2, 2, 3]


def test_preempted_request_needs_prompt_plus_generated() -> None:
    scheduler = Scheduler(num_blocks=16, block_size=4, num_slots=1)
    request = make_request(0, 5, 20, 4)
    scheduler.add(request)
    for _ in range(6):
        scheduler.update(scheduler.schedule(), {0: 7})
    scheduler._preempt(request, SchedulerOutput())
    assert request.output_token_ids == [7] * 6
    assert scheduler.blocks_needed_for(request) == blocks_for_length(11, 4)


def test_reserve_policy_books_the_worst_case() -> None:
    scheduler = Scheduler(num_blocks=16, block_size=4, num_slots=1, policy="reserve")
    assert scheduler.blocks_needed_for(make_request(0, 5, 24, 4)) == 8


# -- victims and the queue ---------------------------------------------------------------


def test_victim_is_the_youngest_running_request() -> None:
    scheduler = Scheduler(num_blocks=6, block_size=4, num_slots=3)
    requests = uniform_burst(3, 8, 8, 4)
    for request in requests:
        scheduler.add(request)
    scheduler.update(scheduler.schedule(), {0: 7, 1: 7, 2: 7})
    out = scheduler.schedule()
    # Each now needs a third block; the pool is dry, so the youngest goes first.
    assert [r.request_id for r in out.preempted] == [2]
    assert [r.request_id for r in scheduler.running] == [0, 1]
    assert scheduler.waiting[0] is requests[2]
    assert requests[2].output_token_ids == [7]
    scheduler.check_integrity()


def test_the_victim_rule_is_one_overridable_method() -> None:
    class OldestFirst(Scheduler):
        def select_victim(self, candidates: list[Request]) -> Request:
            return candidates[0]

    scheduler = OldestFirst(num_blocks=6, block_size=4, num_slots=3)
    for request in uniform_burst(3, 8, 8, 4):
        scheduler.add(request)
    scheduler.update(scheduler.schedule(), {0: 7, 1: 7, 2: 7})
    out = scheduler.schedule()
    # Request 0 needs a block first and evicts itself; 1 and 2 then find one free each.
    assert [r.request_id for r in out.preempted] == [0]
    assert [r.request_id for r in scheduler.running] == [1, 2]
    scheduler.check_integrity()


def test_queue_order_after_several_preemptions() -> None:
    scheduler = Scheduler(num_blocks=7, block_size=4, num_slots=4)
    requests = uniform_burst(5, 4, 8, 4)
    for request in requests:
        scheduler.add(request)
    scheduler.update(scheduler.schedule(), {i: 7 for i in range(4)})
    out = scheduler.schedule()
    # Four rows want a second block with three free: r3 is evicted, then r2 to serve r1...
    assert [r.request_id for r in out.preempted] == [3]
    assert [r.request_id for r in scheduler.waiting] == [3, 4]
    scheduler.update(out, {r.request.request_id: 7 for r in out.rows})
    scheduler.check_integrity()


def test_a_request_with_nobody_younger_is_its_own_victim() -> None:
    scheduler = Scheduler(num_blocks=3, block_size=4, num_slots=2)
    older, younger = make_request(0, 6, 2, 4), make_request(1, 4, 8, 4)
    scheduler.add(older)
    scheduler.add(younger)
    scheduler.update(scheduler.schedule(), {0: 7, 1: 7})
    out = scheduler.schedule()
    # The older one still fits its 7 tokens in 2 blocks; the younger one crosses into a
    # second block with the pool dry, and nobody is younger than itself.
    assert out.preempted == [younger]
    assert [row.request for row in out.rows] == [older]
    assert younger.state == RequestState.WAITING and scheduler.waiting[0] is younger
    scheduler.check_integrity()


def test_head_of_line_blocking() -> None:
    scheduler = Scheduler(num_blocks=5, block_size=4, num_slots=3)
    blocker, big, small = (
        make_request(0, 8, 4, 4),
        make_request(1, 16, 4, 4),
        make_request(2, 4, 4, 4),
    )
    scheduler.add(blocker)
    scheduler.update(scheduler.schedule(), {0: 7})
    scheduler.add(big)
    scheduler.add(small)
    out = scheduler.schedule()
    # The big one does not fit next to the blocker; the small one waits behind it anyway.
    assert out.rows[0].request is blocker and len(out.rows) == 1
    assert list(scheduler.waiting) == [big, small]


def test_door_check_refuses_a_worst_case_beyond_the_empty_pool() -> None:
    scheduler = Scheduler(num_blocks=8, block_size=4, num_slots=2)
    with pytest.raises(ValueError, match="pool has 8"):
        scheduler.add(make_request(0, 5, 28, 4))
    assert not scheduler.waiting
    scheduler.add(make_request(1, 5, 27, 4))


def test_reserve_never_preempts() -> None:
    scheduler = Scheduler(num_blocks=12, block_size=4, num_slots=4, policy="reserve")
    run = drive(scheduler, uniform_burst(4, 5, 24, 4))
    assert run.preemptions == 0 and run.recomputed == 0


def test_watermark_keeps_blocks_free_at_admission() -> None:
    scheduler = Scheduler(num_blocks=8, block_size=4, num_slots=4, watermark=3)
    for request in uniform_burst(4, 8, 2, 4):
        scheduler.add(request)
    out = scheduler.schedule()
    assert len(out.rows) == 2 and scheduler.pool.num_free == 4


# -- release ------------------------------------------------------------------------------


def test_update_gives_back_a_finished_requests_blocks_and_slot() -> None:
    scheduler = Scheduler(num_blocks=8, block_size=4, num_slots=2)
    short, long = make_request(0, 3, 2, 4), make_request(1, 6, 8, 4)
    for request in (short, long):
        scheduler.add(request)
    scheduler.update(scheduler.schedule(), {0: 7, 1: 7})
    out = scheduler.schedule()
    assert scheduler.pool.num_free == 5  # short: 1 block, long: 2
    finished = scheduler.update(out, {0: 7, 1: 7})
    # Inside the update that produced its last token, not at the next schedule().
    assert finished == [short] and short.state == RequestState.FINISHED
    assert short.slot is None and not short.block_table.block_ids
    assert scheduler.running == [long] and list(scheduler.free_slots) == [0]
    assert scheduler.pool.num_free == 6
    scheduler.check_integrity()


def test_the_update_that_finishes_the_last_request_empties_the_scheduler() -> None:
    scheduler = Scheduler(num_blocks=8, block_size=4, num_slots=2)
    for request in uniform_burst(2, 5, 3, 4):
        scheduler.add(request)
    for _ in range(3):
        assert scheduler.has_unfinished()
        finished = scheduler.update(scheduler.schedule(), {0: 7, 1: 7})
    assert len(finished) == 2 and not scheduler.has_unfinished()
    assert scheduler.pool.num_free == 8 and len(scheduler.free_slots) == 2
    assert not scheduler.schedule().rows


# -- abort --------------------------------------------------------------------------------


def test_abort_waiting_running_and_preempted() -> None:
    scheduler = Scheduler(num_blocks=3, block_size=4, num_slots=2)
    a, b, c = (make_request(i, 4, 8, 4) for i in range(3))
    for request in (a, b, c):
        scheduler.add(request)
    scheduler.update(scheduler.schedule(), {0: 7, 1: 7})
    scheduler.abort(c)  # waiting
    assert c.state == RequestState.ABORTED and c not in scheduler.waiting
    scheduler.schedule()  # both need a second block, one is free: b is its own victim
    assert b.state == RequestState.WAITING and b.num_preemptions == 1
    scheduler.abort(b)  # preempted
    scheduler.abort(a)  # running
    scheduler.check_integrity()
    assert scheduler.pool.num_free == 3 and not scheduler.has_unfinished()
    with pytest.raises(ValueError):
        scheduler.abort(a)


# -- the seeds' tables, over integers -----------------------------------------------------


@pytest.mark.parametrize(("pool_tokens", "policy"), list(seeds.DAY33))
def test_day33_table(pool_tokens: int, policy: str) -> None:
    scheduler = Scheduler(
        num_blocks=pool_tokens // seeds.DAY33_BLOCK,
        block_size=seeds.DAY33_BLOCK,
        num_slots=seeds.DAY33_SLOTS,
        policy=policy,
    )
    burst = uniform_burst(
        seeds.DAY33_REQUESTS, seeds.DAY33_PROMPT, seeds.DAY33_BUDGET, seeds.DAY33_BLOCK
    )
    run = drive(scheduler, burst)
    expected = seeds.DAY33[(pool_tokens, policy)]
    assert (run.iterations, run.preemptions, run.recomputed) == (
        expected.iterations,
        expected.preemptions,
        expected.recomputed,
    )
    assert round(run.tokens / (run.iterations * seeds.DAY33_SLOTS), 3) == expected.occupancy
    assert run.tokens == seeds.DAY33_TOKENS


def test_day34_staircase_at_12_blocks() -> None:
    scheduler = Scheduler(num_blocks=12, block_size=seeds.DAY34_BLOCK, num_slots=seeds.DAY34_SLOTS)
    burst = uniform_burst(
        seeds.DAY34_REQUESTS, seeds.DAY34_PROMPT, seeds.DAY34_BUDGET, seeds.DAY34_BLOCK
    )
    run = drive(scheduler, burst)
    assert [run.latency[i] for i in range(seeds.DAY34_REQUESTS)] == seeds.DAY34_STAIRCASE_AT_12
    assert run.evictions[seeds.DAY34_REQUESTS - 1] == seeds.DAY34_YOUNGEST_EVICTIONS_AT_12
    evictions = round(seeds.DAY34[12].evictions_per_request * seeds.DAY34_REQUESTS)
    assert (run.forward_tokens, run.recomputed, run.preemptions) == (
        seeds.DAY34_FORWARD_POSITIONS[12],
        seeds.DAY34_RECOMPUTED_AT_12,
        evictions,
    )


def test_day29_shape_needs_31_blocks_reserved_and_16_incremental() -> None:
    def requests() -> list[Request]:
        return [make_request(i, 5, 32 if i == 7 else 4, 4) for i in range(8)]

    def all_admitted_at_once(num_blocks: int, policy: str) -> bool:
        scheduler = Scheduler(num_blocks=num_blocks, block_size=4, num_slots=8, policy=policy)
        run = drive(scheduler, requests())
        return run.preemptions == 0 and run.iterations == 32

    for policy, smallest in seeds.DAY29_SHAPE_SMALLEST_POOL.items():
        assert all_admitted_at_once(smallest, policy)
        assert not all_admitted_at_once(smallest - 1, policy)


# -- preemption by swap -------------------------------------------------------------------


def swap_scheduler(swap_blocks: int = 8, **kwargs: object) -> Scheduler:
    """Six blocks of four, three slots: three 8-token prompts fill the pool at once."""
    return Scheduler(
        num_blocks=6,
        block_size=4,
        num_slots=3,
        preemption="swap",
        swap_blocks=swap_blocks,
        **kwargs,
    )


def step(scheduler: Scheduler) -> SchedulerOutput:
    """One schedule and one fake forward (token 7 for every row), integrity checked after each."""
    out = scheduler.schedule()
    scheduler.check_integrity()
    scheduler.update(out, {row.request.request_id: 7 for row in out.rows})
    scheduler.check_integrity()
    return out


def test_swap_out_moves_the_victims_blocks_to_host_blocks_and_keeps_its_kv() -> None:
    scheduler = swap_scheduler()
    requests = uniform_burst(3, 8, 8, 4)
    for request in requests:
        scheduler.add(request)
    step(scheduler)
    victim = requests[2]
    device_ids = list(victim.block_table.block_ids)
    out = scheduler.schedule()
    # Each needs a third block with the pool dry: the youngest goes, to host memory this time.
    assert out.preempted == [victim] and out.swapped_out == [victim]
    assert victim.state == RequestState.SWAPPED and list(scheduler.swapped) == [victim]
    host_ids = scheduler.swap.host_blocks_of(victim)
    assert out.blocks_to_swap_out == list(zip(device_ids, host_ids, strict=True))
    # Its table names no block now but still counts every position it had computed.
    assert victim.block_table.num_tokens == 8 and victim.slot is None
    assert not victim.block_table.block_ids and len(host_ids) == 2
    assert scheduler.swap.num_free == 6
    assert scheduler.blocks_needed_for(victim) == blocks_for_length(victim.num_tokens, 4)
    assert (victim.num_preemptions, victim.num_swaps) == (1, 1)
    assert not scheduler.waiting
    scheduler.check_integrity()


def test_a_swapped_request_comes_back_as_a_decode_row_over_its_own_blocks() -> None:
    scheduler = swap_scheduler()
    requests = uniform_burst(3, 8, 8, 4)
    for request in requests:
        scheduler.add(request)
    step(scheduler)
    out = step(scheduler)
    host_ids = [host for _, host in out.blocks_to_swap_out]
    while not out.swapped_in:
        out = step(scheduler)
    request = requests[2]
    assert out.swapped_in == [request] and not out.preempted
    (row,) = [row for row in out.rows if row.request is request]
    # The token it sampled before leaving is decoded now: one position, nothing recomputed.
    assert not row.is_prefill and row.num_positions == 1 and row.recomputed == 0
    assert row.start_position == 8
    kept = request.block_table.block_ids[: len(host_ids)]
    assert out.blocks_to_swap_in == list(zip(host_ids, kept, strict=True))
    assert len(request.block_table.block_ids) == blocks_for_length(row.end_position, 4)


def test_swapped_requests_return_in_the_order_they_left_and_before_anyone_waiting() -> None:
    scheduler = swap_scheduler()
    burst = uniform_burst(3, 8, 8, 4)
    late = make_request(3, 4, 4, 4)
    for request in [*burst, late]:
        scheduler.add(request)
    left, returned, admitted = [], [], {}
    iteration = 0
    while scheduler.has_unfinished():
        out = step(scheduler)
        iteration += 1
        left += [request.request_id for request in out.swapped_out]
        returned += [request.request_id for request in out.swapped_in]
        for row in out.rows:
            if row.is_prefill:
                admitted[row.request.request_id] = iteration
                # Nobody is admitted while someone who left before is still in swap.
                assert returned == left
    assert left == [2, 1] and returned == left
    # The late request could have had a block and a slot long before: it waited for r1.
    assert admitted[late.request_id] > admitted[0] + 2


def test_a_full_swap_space_preempts_by_recompute() -> None:
    scheduler = swap_scheduler(swap_blocks=2)
    requests = uniform_burst(3, 8, 8, 4)
    for request in requests:
        scheduler.add(request)
    kinds = {}
    resumed_rows = []
    while scheduler.has_unfinished():
        out = step(scheduler)
        swapped = {request.request_id for request in out.swapped_out}
        for victim in out.preempted:
            kinds[victim.request_id] = "swap" if victim.request_id in swapped else "recompute"
        resumed_rows += [row for row in out.rows if row.recomputed]
    # r2's two blocks fill the swap space; r1, evicted next with three, falls back.
    assert kinds == {2: "swap", 1: "recompute"}
    assert (requests[1].num_preemptions, requests[1].num_swaps) == (1, 0)
    assert [(row.request, row.recomputed) for row in resumed_rows] == [(requests[1], 13)]


def test_swap_with_no_swap_blocks_is_preemption_by_recompute() -> None:
    def run(preemption: str) -> Run:
        scheduler = Scheduler(
            num_blocks=12,
            block_size=seeds.DAY34_BLOCK,
            num_slots=seeds.DAY34_SLOTS,
            preemption=preemption,
        )
        burst = uniform_burst(
            seeds.DAY34_REQUESTS, seeds.DAY34_PROMPT, seeds.DAY34_BUDGET, seeds.DAY34_BLOCK
        )
        return drive(scheduler, burst)

    recompute = run("recompute")
    assert recompute.preemptions > 0
    assert run("swap") == recompute


def test_day34_at_12_blocks_under_swap_recomputes_nothing() -> None:
    scheduler = Scheduler(
        num_blocks=12,
        block_size=seeds.DAY34_BLOCK,
        num_slots=seeds.DAY34_SLOTS,
        preemption="swap",
        swap_blocks=64,
    )
    burst = uniform_burst(
        seeds.DAY34_REQUESTS, seeds.DAY34_PROMPT, seeds.DAY34_BUDGET, seeds.DAY34_BLOCK
    )
    run = drive(scheduler, burst)
    assert run.preemptions > 0 and run.recomputed == 0
    # Every prompt once, every later token once: nothing is computed twice.
    once = seeds.DAY34_REQUESTS * (seeds.DAY34_PROMPT + seeds.DAY34_BUDGET - 1)
    assert run.forward_tokens == once < seeds.DAY34_FORWARD_POSITIONS[12]
    assert run.tokens == seeds.DAY34_REQUESTS * seeds.DAY34_BUDGET


@pytest.mark.parametrize(("watermark", "budget"), [(1, 16), (2, 10)])
def test_swap_in_keeps_the_watermark_free(watermark: int, budget: int) -> None:
    # Shapes where a swap-in that ignored the watermark would eat into it.
    scheduler = Scheduler(
        num_blocks=6,
        block_size=4,
        num_slots=4,
        watermark=watermark,
        preemption="swap",
        swap_blocks=32,
    )
    for request in uniform_burst(4, 3, budget, 4):
        scheduler.add(request)
    swap_ins = 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        if out.swapped_in:
            # The admission rule: what a swap-in takes leaves the watermark free.
            assert scheduler.pool.num_free >= watermark
            swap_ins += len(out.swapped_in)
        scheduler.update(out, {row.request.request_id: 7 for row in out.rows})
        scheduler.check_integrity()
    assert swap_ins > 0


def test_abort_of_a_swapped_request_frees_its_host_blocks() -> None:
    scheduler = swap_scheduler()
    requests = uniform_burst(3, 8, 8, 4)
    for request in requests:
        scheduler.add(request)
    step(scheduler)
    step(scheduler)
    victim = requests[2]
    assert victim.state == RequestState.SWAPPED
    scheduler.abort(victim)
    assert victim.state == RequestState.ABORTED and not scheduler.swapped
    assert scheduler.swap.num_free == 8 and not victim.block_table.block_ids
    scheduler.check_integrity()
    while scheduler.has_unfinished():
        step(scheduler)
    assert [len(r.output_token_ids) for r in requests[:2]] == [8, 8]
    assert scheduler.pool.num_free == 6


def test_reserve_never_swaps() -> None:
    scheduler = Scheduler(
        num_blocks=12, block_size=4, num_slots=4, policy="reserve", preemption="swap", swap_blocks=8
    )
    run = drive(scheduler, uniform_burst(4, 5, 24, 4))
    reserve = drive(
        Scheduler(num_blocks=12, block_size=4, num_slots=4, policy="reserve"),
        uniform_burst(4, 5, 24, 4),
    )
    assert run == reserve and run.preemptions == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preemption": "lru"}, r"preemption must be one of \('recompute', 'swap'\), got 'lru'"),
        ({"preemption": "swap", "swap_blocks": -1}, "swap_blocks must be a whole number >= 0"),
        ({"preemption": "swap", "swap_blocks": 2.5}, "swap_blocks must be a whole number >= 0"),
        ({"preemption": "swap", "swap_blocks": True}, "swap_blocks must be a whole number >= 0"),
        ({"swap_blocks": 4}, "swap_blocks=4 needs preemption='swap'"),
    ],
)
def test_bad_preemption_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(num_blocks=8, block_size=4, num_slots=2, **kwargs)

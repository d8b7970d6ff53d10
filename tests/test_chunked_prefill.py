"""Chunked prefill: `max_num_batched_tokens` caps the positions of every forward.

First the scheduler over plain integers (a fake forward samples token 7 for every row that
samples, integrity checked after every schedule and every update), then the engine on the
embedded model (the same text and the same seeded samples whatever the budget, in a roomy
pool, a cramped one and under swap), then `llmengine serve`'s flag and a served engine.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from server_helpers import MODEL_NAME, served

import llmengine
from llmengine.cli import build_parser, main
from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import Scheduler, SchedulerOutput

FAKE_TOKEN = 7


def make_request(request_id: int, prompt_len: int, max_tokens: int, block_size: int) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[1] * prompt_len,
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival=request_id,
        block_size=block_size,
    )


def fake_step(scheduler: Scheduler) -> SchedulerOutput:
    """One schedule and one fake forward: a token only for the rows that sample."""
    out = scheduler.schedule()
    scheduler.check_integrity()
    scheduler.update(out, {row.request.request_id: FAKE_TOKEN for row in out.rows if row.samples})
    scheduler.check_integrity()
    return out


def shape(out: SchedulerOutput) -> list[tuple[int, int, int, bool]]:
    """Each row as (request id, first position, positions, samples), in the decision's order."""
    return [
        (row.request.request_id, row.start_position, row.num_positions, row.samples)
        for row in out.rows
    ]


# -- the scheduler -------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [3, 0, -1, True, 4.0, "8"])
def test_a_budget_below_num_slots_or_not_a_whole_number_is_refused(budget: Any) -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(num_blocks=8, block_size=4, num_slots=4, max_num_batched_tokens=budget)


def test_a_budget_of_num_slots_is_accepted_and_none_is_no_budget() -> None:
    scheduler = Scheduler(num_blocks=8, block_size=4, num_slots=4, max_num_batched_tokens=4)
    assert scheduler.config.max_num_batched_tokens == 4
    scheduler = Scheduler(num_blocks=64, block_size=4, num_slots=2)
    request = make_request(0, 200, 2, 4)
    scheduler.add(request)
    assert shape(fake_step(scheduler)) == [(0, 0, 200, True)]


def test_a_long_prompt_is_prefilled_over_several_steps_in_chunks_of_the_budget() -> None:
    scheduler = Scheduler(num_blocks=16, block_size=4, num_slots=2, max_num_batched_tokens=8)
    request = make_request(0, 21, 3, 4)
    scheduler.add(request)
    out = fake_step(scheduler)
    assert shape(out) == [(0, 0, 8, False)] and out.admitted == [request]
    # Admitted with the blocks for its whole prompt; only the computation waits.
    assert request.state is RequestState.RUNNING and request.slot is not None
    assert len(request.block_table.block_ids) == 6 and request.block_table.num_tokens == 8
    assert request.num_output_tokens == 0 and request.prefilling
    out = fake_step(scheduler)
    assert shape(out) == [(0, 8, 8, False)] and not out.admitted
    out = fake_step(scheduler)
    assert shape(out) == [(0, 16, 5, True)] and request.num_output_tokens == 1
    assert all(row.is_prefill for row in out.rows) and not request.prefilling
    out = fake_step(scheduler)
    assert shape(out) == [(0, 21, 1, True)] and not out.rows[0].is_prefill
    fake_step(scheduler)
    assert request.state is RequestState.FINISHED and request.num_output_tokens == 3
    assert scheduler.pool.num_free == scheduler.pool.num_blocks


def test_decodes_come_first_then_the_unfinished_prefill_then_admissions() -> None:
    scheduler = Scheduler(num_blocks=64, block_size=4, num_slots=3, max_num_batched_tokens=6)
    r0, r1, r2 = (make_request(i, n, 4, 4) for i, n in enumerate((2, 9, 7)))
    for request in (r0, r1, r2):
        scheduler.add(request)
    steps = [fake_step(scheduler) for _ in range(4)]
    assert [shape(out) for out in steps] == [
        # r0's whole prompt, then what is left for r1; r2 waits: the budget is spent.
        [(0, 0, 2, True), (1, 0, 4, False)],
        # r0 decodes first; r1 (running, part way) goes before r2 (waiting), and finishes.
        [(0, 2, 1, True), (1, 4, 5, True)],
        [(0, 3, 1, True), (1, 9, 1, True), (2, 0, 4, False)],
        [(0, 4, 1, True), (1, 10, 1, True), (2, 4, 3, True)],
    ]
    assert [[r.request_id for r in out.admitted] for out in steps] == [[0, 1], [], [2], []]
    assert [[row.is_prefill for row in out.rows] for out in steps] == [
        [True, True],
        [False, True],
        [False, False, True],
        [False, False, True],
    ]


def tight_pool(preemption: str) -> tuple[Scheduler, Request, Request]:
    """r0 decodes into a pool that r1's chunked prefill fills, until r0 needs a block.

    Block size 4, 6 blocks, budget 4: r0 (a 4-token prompt, 12 to generate) takes the whole
    first step; r1 (16 tokens, 4 blocks) is admitted next to r0's decodes and prefills 3
    positions a step, so after 4 of its chunks it has 12 positions computed and r0, at 9
    tokens, needs a third block that only evicting r1 gives it.
    """
    swap_blocks = 8 if preemption == "swap" else 0
    scheduler = Scheduler(
        num_blocks=6,
        block_size=4,
        num_slots=2,
        max_num_batched_tokens=4,
        preemption=preemption,
        swap_blocks=swap_blocks,
    )
    r0, r1 = make_request(0, 4, 12, 4), make_request(1, 16, 1, 4)
    scheduler.add(r0)
    scheduler.add(r1)
    return scheduler, r0, r1


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_victim_evicted_mid_prefill_recomputes_only_what_it_had_computed(
    preemption: str,
) -> None:
    scheduler, r0, r1 = tight_pool(preemption)
    steps = [fake_step(scheduler) for _ in range(5)]
    assert [shape(out) for out in steps[1:]] == [
        [(0, 4 + i, 1, True), (1, 3 * i, 3, False)] for i in range(4)
    ]
    out = fake_step(scheduler)
    # Under swap too: a partial prefill cannot come back as a decode, so it is recomputed.
    assert out.preempted == [r1] and not out.swapped_out and not out.blocks_to_swap_out
    assert r1.state is RequestState.WAITING and r1.num_discarded_tokens == 12
    assert scheduler.swap.num_free == scheduler.swap.num_blocks
    resumed = []
    for _ in range(40):
        if not scheduler.has_unfinished():
            break
        out = fake_step(scheduler)
        resumed += [row for row in out.rows if row.request is r1]
    assert not scheduler.has_unfinished()
    # Back in chunks of the budget: the 12 positions it had computed are recomputed, the
    # last 4 are new, and only the chunk that reaches its last token samples.
    assert [(row.start_position, row.num_positions, row.samples) for row in resumed] == [
        (0, 4, False),
        (4, 4, False),
        (8, 4, False),
        (12, 4, True),
    ]
    assert [row.recomputed for row in resumed] == [4, 4, 4, 0]
    assert r0.num_output_tokens == 12 and r1.num_output_tokens == 1
    assert scheduler.pool.num_free == scheduler.pool.num_blocks


def test_a_request_evicted_while_decoding_recomputes_all_its_tokens_in_chunks() -> None:
    # Block size 4, 5 blocks, budget 4. r1 (3 prompt tokens) decodes next to r0 until, at
    # 9 tokens, it needs a third block with the pool dry and is its own victim (the youngest).
    scheduler = Scheduler(num_blocks=5, block_size=4, num_slots=2, max_num_batched_tokens=4)
    r0, r1 = make_request(0, 4, 12, 4), make_request(1, 3, 8, 4)
    scheduler.add(r0)
    scheduler.add(r1)
    evictions = []
    resumed = []
    for _ in range(60):
        if not scheduler.has_unfinished():
            break
        out = fake_step(scheduler)
        evictions += [(victim, victim.num_tokens) for victim in out.preempted]
        if evictions:
            resumed += [row for row in out.rows if row.request is r1 and row.is_prefill]
    assert not scheduler.has_unfinished()
    assert evictions == [(r1, 9)] and r1.num_discarded_tokens == 9
    # Every token it had, its last sampled one too, counts as recomputed (lesson 14's rule),
    # in chunks of the budget (r0 has finished by then), and only the last one samples.
    assert [
        (row.start_position, row.num_positions, row.samples, row.recomputed) for row in resumed
    ] == [(0, 4, False, 4), (4, 4, False, 4), (8, 1, True, 1)]
    assert r1.num_output_tokens == 8 and r0.num_output_tokens == 12


def test_a_victim_lost_twice_recomputes_every_position_it_ever_lost() -> None:
    # 4 blocks of 4, 3 slots, budget 3; r0 has a 3-token prompt, r1 and r2 one token each.
    # r2 is evicted while decoding at 5 tokens; readmitted, it is evicted again part way
    # through recomputing them (4 computed); its third prefill recomputes all 5 anew.
    scheduler = Scheduler(num_blocks=4, block_size=4, num_slots=3, max_num_batched_tokens=3)
    r0, r1, r2 = make_request(0, 3, 9, 4), make_request(1, 1, 12, 4), make_request(2, 1, 12, 4)
    for request in (r0, r1, r2):
        scheduler.add(request)
    evictions = []
    prefills: list[list[tuple[int, int, bool, int]]] = []
    for _ in range(60):
        if not scheduler.has_unfinished():
            break
        before = {r.request_id: (r.prefilling, r.block_table.num_tokens) for r in scheduler.running}
        out = fake_step(scheduler)
        evictions += [(v.request_id, *before[v.request_id]) for v in out.preempted]
        for row in out.rows:
            if row.request is r2 and row.is_prefill:
                if row.start_position == 0:
                    prefills.append([])
                prefills[-1].append(
                    (row.start_position, row.num_positions, row.samples, row.recomputed)
                )
    assert not scheduler.has_unfinished()
    # (who, mid-prefill, positions with K/V) at each eviction: r2 decoding, r1 decoding, r2
    # in the middle of its resumed prefill.
    assert evictions == [(2, False, 4), (1, False, 5), (2, True, 4)]
    assert prefills == [
        [(0, 1, True, 0)],
        [(0, 2, False, 2), (2, 2, False, 2)],
        [(0, 3, False, 3), (3, 2, True, 2)],
    ]
    assert r2.num_discarded_tokens == 5 and r2.num_output_tokens == 12


def test_a_request_swapped_in_beside_a_partial_prefill_decodes_within_the_budget() -> None:
    # 9 blocks of 4, 4 slots, budget 4, a swap space of 2 blocks. r3 is swapped out (step 8);
    # r2, evicted next with the swap space full, falls back to recompute as r3 comes back
    # (10); r2's resumed prefill is chunked (11-13); r3, younger, is swapped out again
    # meanwhile (12) and, once r1 finishes, comes back while r2 is still part way (13).
    scheduler = Scheduler(
        num_blocks=9,
        block_size=4,
        num_slots=4,
        preemption="swap",
        swap_blocks=2,
        max_num_batched_tokens=4,
    )
    specs = [(2, 10), (9, 9), (4, 16), (2, 4), (20, 13)]
    requests = [make_request(i, n, t, 4) for i, (n, t) in enumerate(specs)]
    for request in requests:
        scheduler.add(request)
    steps = [fake_step(scheduler) for _ in range(13)]
    r2, r3 = requests[2], requests[3]
    assert [(out.preempted, out.swapped_out, out.swapped_in) for out in steps[7:13]] == [
        ([r3], [r3], []),
        ([], [], []),
        ([r2], [], [r3]),
        ([], [], []),
        ([r3], [r3], []),
        ([], [], [r3]),
    ]
    assert steps[10].admitted == [r2] and not steps[10].rows[-1].samples
    # The swapped-in decode goes before the unfinished prefill, which gets what is left.
    assert shape(steps[12]) == [(3, 4, 1, True), (2, 5, 3, False)]
    assert r2.prefilling


def random_workload(rng: random.Random, count: int, block_size: int) -> list[Request]:
    return [
        make_request(i, rng.choice((1, 2, 5, 9, 17, 30)), rng.randint(1, 16), block_size)
        for i in range(count)
    ]


@pytest.mark.parametrize("seed", range(16))
def test_random_workloads_keep_the_budget_and_the_order_every_step(seed: int) -> None:
    rng = random.Random(seed)
    block_size, num_slots = rng.choice((2, 4)), rng.randint(2, 4)
    budget = rng.choice((num_slots, num_slots + 1, 7, 16))
    preemption = rng.choice(("recompute", "swap"))
    requests = random_workload(rng, 10, block_size)
    # A pool barely above the largest worst case, so that incremental runs preempt.
    largest = max(-(-r.worst_case_tokens // block_size) for r in requests)
    scheduler = Scheduler(
        num_blocks=largest + rng.randint(0, 3),
        block_size=block_size,
        num_slots=num_slots,
        policy=rng.choice(("incremental", "incremental", "reserve")),
        preemption=preemption,
        swap_blocks=rng.choice((0, 4, 16)) if preemption == "swap" else 0,
        max_num_batched_tokens=budget,
    )
    for request in requests:
        scheduler.add(request)
    chunked = 0
    for _ in range(2000):
        if not scheduler.has_unfinished():
            break
        out = fake_step(scheduler)
        assert out.rows and sum(row.num_positions for row in out.rows) <= budget
        kinds = [row.is_prefill for row in out.rows]
        assert kinds == sorted(kinds), "a decode row after a prefill chunk"
        chunked += sum(not row.samples for row in out.rows)
    assert not scheduler.has_unfinished()
    assert [r.num_output_tokens for r in requests] == [r.params.max_tokens for r in requests]
    assert scheduler.pool.num_free == scheduler.pool.num_blocks
    assert len(scheduler.free_slots) == num_slots
    if any(len(r.prompt_token_ids) > budget for r in requests):
        assert chunked > 0


# -- the engine on real weights ------------------------------------------------------------

LENGTHS = (70, 3, 45, 9, 33, 17, 58, 5)
BUDGETS = (None, 4, 7, 16, 33)  # 4 is num_slots, the smallest allowed
POOLS = {
    "roomy": {"num_blocks": 64},
    "cramped": {"num_blocks": 24},
    "swap": {"num_blocks": 24, "preemption": "swap", "swap_blocks": 64},
}


@pytest.fixture(scope="module")
def prompts(model: llmengine.Llama) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in LENGTHS]


def run(
    model: llmengine.Llama,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    budget: int | None,
    **pool: Any,
) -> tuple[list[list[int]], list[IterationOutcome]]:
    """Run to completion, integrity and the budget checked every step; outputs and outcomes."""
    engine = Engine(model, block_size=4, num_slots=4, max_num_batched_tokens=budget, **pool)
    ids = engine.add_requests(prompts, params)
    outcomes = []
    for _ in range(500):
        if not engine.has_unfinished():
            break
        outcome = engine.step()
        engine.check_integrity()
        assert budget is None or outcome.forward_tokens <= budget
        outcomes.append(outcome)
    assert not engine.has_unfinished()
    assert engine.num_free_blocks == engine.num_blocks
    assert engine.num_free_swap_blocks == engine.num_swap_blocks
    return [engine.release(request_id).output_token_ids for request_id in ids], outcomes


def evicted_mid_prefill(outcomes: list[IterationOutcome]) -> list[int]:
    """Victims evicted after their first prefill chunk and before the one that sampled."""
    started: set[int] = set()
    victims = []
    for outcome in outcomes:
        victims += [request_id for request_id in outcome.evicted if request_id in started]
        started -= set(outcome.evicted)  # before admission: a victim may be back at once
        started |= set(outcome.admitted)
        started -= set(outcome.tokens)
    return victims


GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("pool", POOLS)
def test_greedy_text_is_the_same_whatever_the_budget(
    model: llmengine.Llama, prompts: list[list[int]], pool: str
) -> None:
    reference, _ = run(model, prompts, GREEDY, None, **POOLS["roomy"])
    for budget in BUDGETS:
        outputs, outcomes = run(model, prompts, GREEDY, budget, **POOLS[pool])
        assert outputs == reference, f"budget {budget}, {pool} pool"
        partial = sum(len(o.row_positions) - len(o.tokens) for o in outcomes)
        assert (partial > 0) == (budget is not None), "the long prompts were chunked"
        assert sum(len(o.admitted) for o in outcomes) == len(prompts) + sum(
            len(o.evicted) - len(o.swapped_out) for o in outcomes
        ), "one admission per request and per eviction by recompute"
        evicted = sum(len(o.evicted) for o in outcomes)
        assert (evicted > 0) == (pool != "roomy"), f"budget {budget}, {pool} pool"
        if pool == "swap":
            # A partial prefill falls back to recompute; every other victim is swapped.
            fallbacks = evicted - sum(len(o.swapped_out) for o in outcomes)
            assert fallbacks == len(evicted_mid_prefill(outcomes))
            # With the two smallest budgets this workload evicts a long prompt mid-prefill.
            assert budget not in (4, 7) or fallbacks > 0


def test_seeded_sampling_is_the_same_whatever_the_budget(
    model: llmengine.Llama, prompts: list[list[int]]
) -> None:
    params = [
        SamplingParams(max_tokens=10, temperature=0.8, seed=seed, ignore_eos=True)
        for seed in range(len(prompts))
    ]
    reference, _ = run(model, prompts, params, None, **POOLS["roomy"])
    assert len({tuple(tokens) for tokens in reference}) == len(prompts)
    for budget in BUDGETS[1:]:
        outputs, outcomes = run(model, prompts, params, budget, **POOLS["cramped"])
        assert outputs == reference, f"budget {budget}"
        assert any(o.evicted for o in outcomes)


def test_abort_mid_prefill_gives_back_its_blocks_and_slot_at_once(
    model: llmengine.Llama, prompts: list[list[int]]
) -> None:
    engine = Engine(model, num_blocks=64, block_size=4, num_slots=4, max_num_batched_tokens=16)
    long_id = engine.add_request(prompts[0], GREEDY)
    short_id = engine.add_request(prompts[1], GREEDY)
    outcome = engine.step()
    assert outcome.admitted == [long_id] and outcome.row_positions == {long_id: 16}
    assert not outcome.tokens
    request = engine.request(long_id)
    assert request.state is RequestState.RUNNING and request.block_table.num_tokens == 16
    assert engine.num_free_blocks == 64 - 18  # the blocks of its whole 70-token prompt
    assert engine.abort(long_id) is True
    assert engine.num_free_blocks == 64 and engine.num_running == 0
    engine.check_integrity()
    for _ in range(GREEDY.max_tokens):
        engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished() and engine.num_free_blocks == 64
    (expected,) = Engine(model, num_blocks=64, block_size=4).generate([prompts[1]], GREEDY)
    assert engine.release(short_id).output_token_ids == expected


def test_an_engine_budget_below_num_slots_is_refused(model: llmengine.Llama) -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(model, num_blocks=8, num_slots=4, max_num_batched_tokens=3)


# -- the server ------------------------------------------------------------------------------


def test_serve_takes_max_num_batched_tokens_to_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["serve"]).max_num_batched_tokens is None
    args = build_parser().parse_args(["serve", "--max-num-batched-tokens", "32"])
    assert args.max_num_batched_tokens == 32
    # The engine, not the parser, knows the rule: the flag reached it before any server ran.
    status = main(["serve", "--max-num-seqs", "4", "--max-num-batched-tokens", "3"])
    assert status == 2 and "max_num_batched_tokens" in capsys.readouterr().err


def test_a_served_engine_with_a_budget_returns_the_offline_text(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    prompt = "KING HENRY:\nWhat say you to the long and weary road that lies before us all?"
    assert len(tokenizer.encode(prompt)) > 8
    engine = Engine(model, num_blocks=64, block_size=4, num_slots=4, max_num_batched_tokens=8)
    offline = Engine(model, num_blocks=64, block_size=4, tokenizer=tokenizer)
    (expected,) = offline.generate_text([prompt], SamplingParams(max_tokens=12))
    with served(engine, tokenizer) as server:
        result = server.openai().completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0
        )
    assert result.choices[0].text == expected

"""The key numbers of lessons 09-12, through the package functions the lessons call.

Every expectation is worked out from the workload's shape (or quoted from the diary's Day-29,
Day-33 and Week-8 numbers), not copied from a run. The scheduling numbers do not depend on
the model: every request is greedy with `ignore_eos=True`, so it runs its whole budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_llama import save_random_llama

import llmengine
from llmengine.bench.timing import ContinuousTiming, percentile
from llmengine.bench.workloads import RequestSpec
from llmengine.scheduling.request import TRANSITIONS, IllegalTransition, Request, RequestState

SLOTS, BLOCK = 8, 4
DAY29_BUDGETS = [32] + [4] * 7


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> llmengine.Llama:
    if (llmengine.embedded_model_path() / "config.json").exists():
        return llmengine.load_model()
    folder: Path = tmp_path_factory.mktemp("road-llama")
    save_random_llama(folder, seed=5)
    return llmengine.load_model(folder)


def day29(model: llmengine.Llama, copies: int = 1, seed: int = 29) -> list[RequestSpec]:
    budgets = DAY29_BUDGETS * copies
    burst = llmengine.uniform_burst(
        len(budgets), 5, 1, vocab_size=model.config.vocab_size, seed=seed
    )
    return llmengine.with_budgets(burst, budgets)


def engine(
    model: llmengine.Llama, num_blocks: int, policy: str = "incremental"
) -> llmengine.Engine:
    return llmengine.Engine(
        model, num_blocks=num_blocks, block_size=BLOCK, num_slots=SLOTS, policy=policy
    )


def in_order(timing: ContinuousTiming, request_ids: list[int]) -> list[int]:
    return [timing.latencies_iterations[request_id] for request_id in request_ids]


# -- lesson 09: static batching and its bill -----------------------------------------------


def test_static_batching_day29_bill(model: llmengine.Llama) -> None:
    workload = day29(model)
    static = llmengine.run_static_batches(model, workload, num_slots=SLOTS)
    continuous = llmengine.run_workload(engine(model, 32), workload)
    assert static.outputs == continuous.outputs
    s, c = static.timing(), continuous.timing()
    # Both take as many forwards as the long request has tokens.
    assert s.iterations == c.iterations == 32
    # Static: 8 rows in each of 32 forwards; continuous: a row per token kept, 7*4 + 32.
    assert (sum(s.rows), sum(c.rows)) == (256, 60)
    assert s.occupancy == c.occupancy == pytest.approx(60 / 256)
    # The decode bill: 7 finished rows in each of the last 28 forwards.
    assert s.waste_fraction == pytest.approx(196 / 256) and c.waste_fraction == 0.0
    # In positions: 8 prompts of 5, then 8, 8, 8 live rows and 28 single ones.
    assert s.padding_fraction == pytest.approx(196 / (196 + 40 + 24 + 28))
    assert c.padding_fraction == 0.0
    assert in_order(s, static.request_ids) == [32] * 8
    assert in_order(c, continuous.request_ids) == DAY29_BUDGETS


def test_static_batching_with_a_queue(model: llmengine.Llama) -> None:
    workload = day29(model, copies=2, seed=30)
    static = llmengine.run_static_batches(model, workload, num_slots=SLOTS).timing()
    continuous = llmengine.run_workload(engine(model, 64), workload).timing()
    # Static: two rectangles of 32. Continuous: the second long request is admitted at
    # step 5, when the first wave's short requests free their slots, and ends at 4 + 32.
    assert (static.iterations, continuous.iterations) == (64, 36)
    assert static.occupancy == pytest.approx(120 / (64 * 8))
    assert continuous.occupancy == pytest.approx(120 / (36 * 8))


# -- lesson 10: the request lifecycle ------------------------------------------------------


def test_request_lifecycle_every_move_not_in_the_table_raises() -> None:
    params = llmengine.SamplingParams(max_tokens=2)
    legal = []
    for source in RequestState:
        for target in RequestState:
            request = Request(
                request_id=0,
                prompt_token_ids=[1],
                params=params,
                arrival=0,
                block_size=4,
                state=source,
            )
            try:
                request.move_to(target)
            except IllegalTransition:
                continue
            legal.append((source, target))
    # Five states (swapped is lesson 18's), eight legal moves, seventeen that raise.
    assert len(legal) == 8 and len(RequestState) ** 2 - len(legal) == 17
    assert set(legal) == {(s, t) for s, moves in TRANSITIONS.items() for t in moves}
    assert TRANSITIONS[RequestState.RUNNING][RequestState.WAITING] == "preempt"
    assert TRANSITIONS[RequestState.RUNNING][RequestState.SWAPPED] == "swap out"
    assert TRANSITIONS[RequestState.SWAPPED][RequestState.RUNNING] == "swap in"


def test_request_lifecycle_one_request_waits_for_the_slot(model: llmengine.Llama) -> None:
    # One slot, and a pool that holds both worst cases (4 blocks each): the younger request
    # waits while the older one takes its 8 forwards, then runs its own 8. Nobody is evicted.
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)
    roomy = llmengine.Engine(model, num_blocks=8, block_size=4, num_slots=1)
    roomy.add_request([11, 12, 13, 14, 15], params)
    younger = roomy.add_request([21, 22, 23, 24, 25], params)
    events, states = [], []
    while roomy.has_unfinished():
        outcome = roomy.step()
        events += [
            event
            for event, ids in (("admit", outcome.admitted), ("finish", outcome.finished))
            if younger in ids
        ]
        states.append(roomy.request(younger).state)
        assert not outcome.evicted
    assert events == ["admit", "finish"]
    waiting, running, finished = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED
    assert states == [waiting] * 8 + [running] * 7 + [finished]


def test_request_lifecycle_one_request_through_preemption(model: llmengine.Llama) -> None:
    # The preempt edge, which lessons 09-12 never take and lesson 13 puts to use. Four blocks,
    # two requests each needing up to four: the younger is evicted when the older needs its
    # third block, and comes back once the older one has finished.
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)
    cramped = llmengine.Engine(model, num_blocks=4, block_size=4, num_slots=2)
    cramped.add_request([11, 12, 13, 14, 15], params)
    younger = cramped.add_request([21, 22, 23, 24, 25], params)
    events = []
    while cramped.has_unfinished():
        outcome = cramped.step()
        for event, ids in (
            ("preempt", outcome.evicted),
            ("admit", outcome.admitted),
            ("finish", outcome.finished),
        ):
            if younger in ids:
                events.append(event)
    assert events == ["admit", "preempt", "admit", "finish"]
    assert cramped.request(younger).num_preemptions == 1


def test_request_lifecycle_door_check(model: llmengine.Llama) -> None:
    door = llmengine.Engine(model, num_blocks=8, block_size=4, num_slots=2)
    too_big = llmengine.SamplingParams(max_tokens=32, ignore_eos=True)
    with pytest.raises(ValueError, match="10 blocks"):
        door.add_request([1, 2, 3, 4, 5], too_big)
    assert not door.has_unfinished() and door.num_free_blocks == 8


@pytest.mark.parametrize("policy", ["reserve", "incremental"])
def test_request_lifecycle_without_the_door_the_queue_is_stuck(policy: str) -> None:
    scheduler = llmengine.Scheduler(num_blocks=8, block_size=4, num_slots=1, policy=policy)
    too_big = llmengine.SamplingParams(max_tokens=32, ignore_eos=True)
    small_params = llmengine.SamplingParams(max_tokens=4, ignore_eos=True)
    giant = Request(
        request_id=0, prompt_token_ids=[1, 2, 3, 4, 5], params=too_big, arrival=0, block_size=4
    )
    small = Request(
        request_id=1, prompt_token_ids=[6, 7, 8], params=small_params, arrival=1, block_size=4
    )
    scheduler.waiting.extend([giant, small])
    for _ in range(200):
        decision = scheduler.schedule()
        scheduler.update(decision, {row.request.request_id: 0 for row in decision.rows})
    assert small.output_token_ids == [] and small.state is RequestState.WAITING
    assert giant.state is RequestState.WAITING
    # Incremental (lesson 13's argument; lesson 10 shows only "reserve"): the giant grows to 8
    # blocks (32 tokens, 27 generated plus the one sampled by the forward that filled them),
    # then needs a ninth and evicts itself.
    assert len(giant.output_token_ids) == (0 if policy == "reserve" else 28)


# -- lesson 11: continuous batching, timed -------------------------------------------------


def test_continuous_batching_uniform_burst_equals_static(model: llmengine.Llama) -> None:
    burst = llmengine.uniform_burst(16, 8, 16, vocab_size=model.config.vocab_size, seed=31)
    for run in (
        llmengine.run_workload(engine(model, 160), burst),
        llmengine.run_static_batches(model, burst, num_slots=SLOTS),
    ):
        timing = run.timing()
        assert timing.iterations == 32 and timing.occupancy == 1.0
        assert sorted(timing.time_to_first_token_s.values()) == [1.0] * 8 + [17.0] * 8
        assert sorted(timing.latencies_s.values()) == [16.0] * 8 + [32.0] * 8
        assert set(timing.time_per_output_token_s.values()) == {1.0}


def test_continuous_batching_mixed_with_arrivals(model: llmengine.Llama) -> None:
    vocab = model.config.vocab_size
    mixed = llmengine.poisson_arrivals(
        llmengine.mixed_workload(
            24, prompt_lens=(4, 24), budgets=(4, 48), vocab_size=vocab, seed=32
        ),
        rate=0.5,
        seed=32,
    )
    continuous_run = llmengine.run_workload(engine(model, 160), mixed)
    static_run = llmengine.run_static_batches(model, mixed, num_slots=SLOTS)
    assert continuous_run.outputs == static_run.outputs
    continuous, static = continuous_run.timing(), static_run.timing()
    budgets = [spec.params.max_tokens for spec in mixed]
    assert continuous.total_tokens == static.total_tokens == sum(budgets)
    assert continuous.preemptions == 0 and max(continuous.rows) <= SLOTS
    # Every running request gets a token from every forward: one iteration per token.
    assert set(continuous.time_per_output_token_s.values()) == {1.0}
    # A request cannot end before its arrival plus its budget, whoever schedules it.
    for index, spec in enumerate(mixed):
        request_id = continuous_run.request_ids[index]
        assert continuous.latencies_s[request_id] >= spec.params.max_tokens
    assert continuous.iterations < static.iterations
    assert continuous.occupancy > static.occupancy
    for q in (50, 90, 99):
        assert percentile(continuous.time_to_first_token_s.values(), q) < percentile(
            static.time_to_first_token_s.values(), q
        )


# -- lesson 12: worst-case reservation -----------------------------------------------------


def test_worst_case_reservation_31_blocks_against_16(model: llmengine.Llama) -> None:
    workload = day29(model)
    reserve = llmengine.sweep_pool_sizes(
        model, workload, range(10, 33), block_size=BLOCK, num_slots=SLOTS, policy="reserve"
    )
    incremental = llmengine.sweep_pool_sizes(
        model, workload, range(10, 20), block_size=BLOCK, num_slots=SLOTS, policy="incremental"
    )
    # The diary's Day-33 numbers: 7 * ceil(9 / 4) + ceil(37 / 4) = 31, and 8 * ceil(5 / 4) = 16.
    assert llmengine.smallest_pool_running_all(reserve) == 31
    assert llmengine.smallest_pool_running_all(incremental) == 16
    assert llmengine.smallest_pool_running_all(reserve[:-2]) is None
    # Reserve at 10 blocks: the long request alone, then the short ones three at a time.
    assert [r.timing.rows[0] for r in reserve[:4]] == [1, 1, 1, 2]
    assert sum(r.timing.preemptions for r in reserve + incremental) == 0


def test_worst_case_reservation_growth_never_needs_a_block(model: llmengine.Llama) -> None:
    needed = {}
    for policy in ("reserve", "incremental"):
        cramped = engine(model, 16, policy)
        for spec in day29(model):
            cramped.add_request(list(spec.prompt_token_ids), spec.params)
        asked = 0
        while cramped.has_unfinished():
            cramped.step()
            scheduler = cramped.scheduler
            asked += any(scheduler.blocks_needed_for(r) for r in scheduler.running)
        needed[policy] = asked
    # Incremental: the long request crosses a block boundary at 9, 13, ..., 33 tokens.
    assert needed == {"reserve": 0, "incremental": 7}


def test_worst_case_reservation_waste(model: llmengine.Llama) -> None:
    reserve = llmengine.run_workload(engine(model, 31, "reserve"), day29(model)).timing()
    incremental = llmengine.run_workload(engine(model, 16), day29(model)).timing()
    # Held: 31 blocks for 4 steps, then the long request's 10 for 28.
    # Written: 8 * 2 blocks for 4 steps, then ceil(t / 4) for t = 9..36.
    held, written = 4 * 31 + 28 * 10, 4 * 16 + 4 * sum(range(3, 10))
    assert sum(reserve.held_blocks) == held and sum(reserve.needed_blocks) == written
    assert reserve.reservation_waste == pytest.approx((held - written) / held)
    assert incremental.reservation_waste == 0.0
    assert incremental.fragmentation_waste == pytest.approx(reserve.fragmentation_waste)


def test_worst_case_reservation_week8_rows_of_the_day33_table(model: llmengine.Llama) -> None:
    day33 = llmengine.uniform_burst(4, 5, 24, vocab_size=model.config.vocab_size, seed=33)
    week8 = llmengine.sweep_pool_sizes(
        model, day33, [12, 24, 32], block_size=BLOCK, num_slots=4, policy="reserve"
    )
    assert [r.timing.iterations for r in week8] == [96, 48, 24]
    assert [r.timing.occupancy for r in week8] == [0.25, 0.5, 1.0]
    assert [r.timing.total_tokens for r in week8] == [96] * 3
    assert [r.timing.rows[0] for r in week8] == [1, 3, 4]

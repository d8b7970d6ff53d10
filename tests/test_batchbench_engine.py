"""batchbench on the real engine: the Day-33 and Day-34 tables come out exactly.

On the shipped model, with the seeds' numbers from `seed_tables`. The tables are about
scheduling, so any model that generates the same text in every pool gives them.
"""

from __future__ import annotations

from typing import Any

import pytest
import seed_tables as seeds

import llmengine
from llmengine.bench.batchbench import PoolResult, run_workload, sweep_pool_sizes
from llmengine.bench.clocks import WallClock
from llmengine.bench.workloads import mixed_workload, staggered, uniform_burst
from llmengine.engine import Engine


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The shipped model: the seeds' tables are measured on it."""
    return llmengine.load_model()


def day34_sweep(model: llmengine.Llama, **engine_kwargs: Any) -> list[PoolResult]:
    """Day 34's burst through Day 34's pools, engines built with `engine_kwargs`."""
    workload = uniform_burst(
        seeds.DAY34_REQUESTS,
        seeds.DAY34_PROMPT,
        seeds.DAY34_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=34,
    )
    return sweep_pool_sizes(
        model,
        workload,
        seeds.DAY34_POOLS,
        block_size=seeds.DAY34_BLOCK,
        num_slots=seeds.DAY34_SLOTS,
        **engine_kwargs,
    )


@pytest.fixture(scope="module")
def day34(model: llmengine.Llama) -> dict[int, PoolResult]:
    results = day34_sweep(model)
    return {result.pool_blocks: result for result in results}


def rounded(values: list[float], digits: int) -> list[float]:
    return [round(value, digits) for value in values]


def test_day34_table(day34: dict[int, PoolResult]) -> None:
    for pool, expected in seeds.DAY34.items():
        timing = day34[pool].timing
        assert timing.total_tokens == seeds.DAY34_TOKENS
        measured = seeds.Day34Row(
            round(timing.occupancy, 3),
            round(timing.preemptions_per_request, 2),
            round(100 * timing.recompute_fraction, 1),
            round(timing.preemption_latency_penalty, 2),  # type: ignore[arg-type]
        )
        assert measured == expected, f"pool {pool}"


def test_rows_cannot_tell_48_blocks_from_12_and_positions_can(
    day34: dict[int, PoolResult],
) -> None:
    roomy, cramped = day34[48].timing, day34[12].timing
    assert sum(roomy.rows) == sum(cramped.rows) == seeds.DAY34_TOKENS
    assert roomy.waste_fraction == cramped.waste_fraction == 0.0
    positions = {48: roomy.total_forward_tokens, 12: cramped.total_forward_tokens}
    assert positions == seeds.DAY34_FORWARD_POSITIONS
    assert cramped.total_recomputed_tokens == seeds.DAY34_RECOMPUTED_AT_12


def test_the_12_block_staircase(day34: dict[int, PoolResult]) -> None:
    cramped = day34[12]
    youngest = seeds.DAY34_REQUESTS - 1
    assert cramped.latencies_iterations == seeds.DAY34_STAIRCASE_AT_12
    assert cramped.timing.mean_latency_iterations == seeds.DAY34_MEAN_LATENCY_AT_12
    victims = cramped.timing.preempted_at
    assert 0 not in victims
    assert len(victims[cramped.run.request_ids[youngest]]) == seeds.DAY34_YOUNGEST_EVICTIONS_AT_12
    # The clean comparison: the same request in two pools.
    assert day34[48].latencies_iterations[youngest] == seeds.DAY34_YOUNGEST_LATENCY_AT_48


def test_tight_pools_catch_victims_young(day34: dict[int, PoolResult]) -> None:
    per_eviction = {pool: round(day34[pool].timing.tokens_per_eviction, 1) for pool in (8, 12)}
    assert per_eviction == seeds.DAY34_PER_EVICTION
    assert day34[48].timing.tokens_per_eviction is None


def test_day34_sweep_under_swap_recomputes_nothing_and_says_what_it_moved(
    model: llmengine.Llama, day34: dict[int, PoolResult]
) -> None:
    results = day34_sweep(model, preemption="swap", swap_blocks=64)
    once = seeds.DAY34_REQUESTS * (seeds.DAY34_PROMPT + seeds.DAY34_BUDGET - 1)
    for result in results:
        timing, recompute = result.timing, day34[result.pool_blocks]
        assert result.outputs == recompute.outputs
        assert timing.total_forward_tokens == once and timing.total_recomputed_tokens == 0
        assert timing.swap_outs == timing.swap_ins == timing.preemptions
        assert timing.total_blocks_swapped_in == timing.total_blocks_swapped_out
        assert (timing.preemptions > 0) == (recompute.timing.preemptions > 0)
    assert results[-1].timing.bytes_swapped > 0 and results[0].timing.bytes_swapped == 0


def test_day34_sweep_with_prefix_caching_takes_positions_instead_of_computing_them(
    model: llmengine.Llama, day34: dict[int, PoolResult]
) -> None:
    """The option reaches every engine: resumed victims find some of their own blocks."""
    results = day34_sweep(model, enable_prefix_caching=True)
    for result in results:
        plain = day34[result.pool_blocks]
        cached = sum(outcome.cached_tokens for outcome in result.run.outcomes)
        assert result.outputs == plain.outputs
        assert result.timing.total_forward_tokens + cached == plain.timing.total_forward_tokens
        assert result.timing.preempted_at == plain.timing.preempted_at
    assert sum(o.cached_tokens for o in results[seeds.DAY34_POOLS.index(12)].run.outcomes) > 0


def test_every_pool_generated_the_same_text(day34: dict[int, PoolResult]) -> None:
    outputs = [day34[pool].outputs for pool in seeds.DAY34_POOLS]
    assert all(output == outputs[0] for output in outputs)
    assert [len(tokens) for tokens in outputs[0]] == [seeds.DAY34_BUDGET] * seeds.DAY34_REQUESTS


@pytest.mark.parametrize("policy", ["reserve", "incremental"])
def test_day33_table(model: llmengine.Llama, policy: str) -> None:
    workload = uniform_burst(
        seeds.DAY33_REQUESTS,
        seeds.DAY33_PROMPT,
        seeds.DAY33_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=33,
    )
    pools_in_tokens = sorted({pool for pool, _ in seeds.DAY33})
    results = sweep_pool_sizes(
        model,
        workload,
        [tokens // seeds.DAY33_BLOCK for tokens in pools_in_tokens],
        block_size=seeds.DAY33_BLOCK,
        num_slots=seeds.DAY33_SLOTS,
        policy=policy,
    )
    for tokens, result in zip(pools_in_tokens, results, strict=True):
        timing = result.timing
        measured = seeds.Day33Row(
            timing.iterations,
            round(timing.occupancy, 3),
            timing.preemptions,
            timing.total_recomputed_tokens,
        )
        assert measured == seeds.DAY33[(tokens, policy)], f"{tokens}-token pool"
        assert timing.total_tokens == seeds.DAY33_TOKENS
    # The worst-case booking holds blocks for text not yet written; a step at a time never does.
    wastes = [result.timing.reservation_waste for result in results]
    assert all(waste > 0 for waste in wastes) if policy == "reserve" else wastes == [0.0] * 3


def test_every_recorded_step_is_a_forward(day34: dict[int, PoolResult]) -> None:
    """No run ends with, or contains, a step that scheduled nothing."""
    for result in day34.values():
        outcomes = result.run.outcomes
        assert all(outcome.rows and outcome.tokens for outcome in outcomes)
        assert len(outcomes) == result.timing.iterations == len(result.run.times)
        assert outcomes[-1].finished


def test_an_engine_that_drains_between_arrivals_waits_without_a_step(
    model: llmengine.Llama,
) -> None:
    workload = staggered(uniform_burst(3, 5, 2, vocab_size=model.config.vocab_size), 10.0)
    run = run_workload(Engine(model, num_blocks=8, block_size=4, num_slots=2), workload)
    assert run.times == [1.0, 2.0, 11.0, 12.0, 21.0, 22.0]
    assert [outcome.rows for outcome in run.outcomes] == [1] * 6
    assert run.timing().latencies_iterations == dict.fromkeys(run.request_ids, 2)


def test_a_pool_too_small_for_the_workload_is_named(model: llmengine.Llama) -> None:
    workload = uniform_burst(2, 5, 24, vocab_size=model.config.vocab_size)
    with pytest.raises(ValueError, match="pool of 4 blocks: .*needs up to 8 blocks"):
        sweep_pool_sizes(model, workload, [12, 4], block_size=4, num_slots=2)


def test_staggered_mixed_workload_on_the_wall_clock(model: llmengine.Llama) -> None:
    workload = staggered(
        mixed_workload(5, prompt_lens=(2, 7), budgets=(3, 9), vocab_size=9, seed=1), 0.002
    )
    engine = Engine(model, num_blocks=10, block_size=4, num_slots=3)
    run = run_workload(engine, workload, clock=WallClock())
    timing = run.timing()
    assert [len(out) for out in run.outputs] == [spec.params.max_tokens for spec in workload]
    assert run.times == sorted(run.times)
    for request_id, latency in timing.latencies_s.items():
        assert 0 < timing.time_to_first_token_s[request_id] <= latency
    assert timing.latencies_iterations.keys() == set(run.request_ids)

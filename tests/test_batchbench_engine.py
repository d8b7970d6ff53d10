"""batchbench on the real engine: the Day-33 and Day-34 tables come out exactly.

The embedded model when its weights are there, a random tiny Llama otherwise: the tables
are about scheduling, so any model that generates the same text in every pool gives them.
"""

from __future__ import annotations

import pytest

import llmengine
from llmengine.bench.batchbench import PoolResult, run_workload, sweep_pool_sizes
from llmengine.bench.clocks import WallClock
from llmengine.bench.workloads import mixed_workload, staggered, uniform_burst
from llmengine.engine import Engine

DAY34_POOLS = [48, 32, 24, 16, 12, 8]


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The shipped model: the seeds' tables are measured on it."""
    return llmengine.load_model()


@pytest.fixture(scope="module")
def day34(model: llmengine.Llama) -> dict[int, PoolResult]:
    workload = uniform_burst(6, 5, 24, vocab_size=model.config.vocab_size, seed=34)
    results = sweep_pool_sizes(model, workload, DAY34_POOLS, block_size=4, num_slots=6)
    return {result.pool_blocks: result for result in results}


def rounded(values: list[float], digits: int) -> list[float]:
    return [round(value, digits) for value in values]


def test_day34_table(day34: dict[int, PoolResult]) -> None:
    timings = [day34[pool].timing for pool in DAY34_POOLS]
    assert [t.total_tokens for t in timings] == [144] * 6
    assert rounded([t.occupancy for t in timings], 3) == [1.0, 0.75, 0.667, 0.462, 0.375, 0.24]
    assert rounded([t.preemptions_per_request for t in timings], 2) == [
        0.0,
        0.33,
        0.5,
        0.83,
        1.17,
        1.33,
    ]
    assert rounded([100 * t.recompute_fraction for t in timings], 1) == [
        0.0,
        21.7,
        26.3,
        32.1,
        39.9,
        37.5,
    ]
    assert rounded([t.preemption_latency_penalty for t in timings], 2) == [  # type: ignore[misc]
        1.0,
        1.25,
        1.39,
        1.71,
        1.9,
        2.83,
    ]


def test_rows_cannot_tell_48_blocks_from_12_and_positions_can(
    day34: dict[int, PoolResult],
) -> None:
    roomy, cramped = day34[48].timing, day34[12].timing
    assert sum(roomy.rows) == sum(cramped.rows) == 144
    assert roomy.waste_fraction == cramped.waste_fraction == 0.0
    assert (roomy.total_forward_tokens, cramped.total_forward_tokens) == (168, 268)
    assert cramped.total_recomputed_tokens == 107


def test_the_12_block_staircase(day34: dict[int, PoolResult]) -> None:
    cramped = day34[12]
    assert cramped.latencies_iterations == [24, 28, 36, 44, 56, 64]
    assert cramped.timing.mean_latency_s == 42.0
    victims = cramped.timing.preempted_at
    assert 0 not in victims and len(victims[cramped.run.request_ids[5]]) == 3
    # The clean comparison: the same request in two pools.
    assert (day34[48].latencies_iterations[5], cramped.latencies_iterations[5]) == (24, 64)


def test_tight_pools_catch_victims_young(day34: dict[int, PoolResult]) -> None:
    assert day34[8].timing.tokens_per_eviction == 12.0
    assert round(day34[12].timing.tokens_per_eviction, 1) == 15.3  # type: ignore[arg-type]
    assert day34[48].timing.tokens_per_eviction is None


def test_every_pool_generated_the_same_text(day34: dict[int, PoolResult]) -> None:
    outputs = [day34[pool].outputs for pool in DAY34_POOLS]
    assert all(output == outputs[0] for output in outputs)
    assert [len(tokens) for tokens in outputs[0]] == [24] * 6


@pytest.mark.parametrize(
    ("policy", "iterations", "occupancy", "preemptions", "recomputed"),
    [
        ("reserve", [96, 48, 24], [0.25, 0.5, 1.0], [0, 0, 0], [0, 0, 0]),
        ("incremental", [44, 28, 24], [0.545, 0.857, 1.0], [3, 1, 0], [55, 25, 0]),
    ],
)
def test_day33_table(
    model: llmengine.Llama,
    policy: str,
    iterations: list[int],
    occupancy: list[float],
    preemptions: list[int],
    recomputed: list[int],
) -> None:
    workload = uniform_burst(4, 5, 24, vocab_size=model.config.vocab_size, seed=33)
    results = sweep_pool_sizes(
        model, workload, [12, 24, 32], block_size=4, num_slots=4, policy=policy
    )
    timings = [result.timing for result in results]
    assert [t.iterations for t in timings] == iterations
    assert rounded([t.occupancy for t in timings], 3) == occupancy
    assert [t.preemptions for t in timings] == preemptions
    assert [t.total_recomputed_tokens for t in timings] == recomputed
    assert [t.total_tokens for t in timings] == [96] * 3
    # The worst-case booking holds blocks for text not yet written; a step at a time never does.
    wastes = [t.reservation_waste for t in timings]
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

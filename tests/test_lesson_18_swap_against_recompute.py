"""Lesson 18, swap against recompute: its claims recomputed with the package.

The measured half runs the lesson's workload (the six-request burst) through the engine on the
shipped model under both preemption modes; the modelled half checks the cost model's formulas
on a shape small enough to count by hand, and the claims the lesson draws from them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import seed_tables as seeds
import torch
from hf_llama import save_random_llama
from report_tables import read_report_table

import llmengine
from llmengine.bench.batchbench import PoolResult, sweep_pool_sizes
from llmengine.bench.workloads import uniform_burst
from llmengine.lessons.fragmentation import kv_bytes_per_position
from llmengine.lessons.preemption_cost import (
    A100_SXM,
    H100_SXM,
    LLAMA_3_1_8B,
    LLAMA_3_2_1B,
    LLAMA_3_2_1B_CARD_PARAMETERS,
    PCIE4_X16,
    PCIE5_X16,
    Gpu,
    attention_flops,
    crossover_context,
    layer_weights,
    linear_ratio,
    parameter_count,
    recompute_flops,
    recompute_seconds,
    swap_bytes,
    swap_seconds,
    weights_per_position,
)
from llmengine.lessons.swap_runs import (
    swap_space_high_water,
    victim_latencies,
    wall_clock_reading,
)
from llmengine.model.config import LlamaConfig

ROOMY_SWAP = 64
MACHINES = [(H100_SXM, PCIE5_X16), (H100_SXM, PCIE4_X16), (A100_SXM, PCIE4_X16)]
REAL_MODELS = [LLAMA_3_2_1B.config, LLAMA_3_1_8B.config]


def day34_sweep(model: llmengine.Llama, pools: list[int], **mode: object) -> list[PoolResult]:
    burst = uniform_burst(
        seeds.DAY34_REQUESTS,
        seeds.DAY34_PROMPT,
        seeds.DAY34_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=34,
    )
    return sweep_pool_sizes(
        model, burst, pools, block_size=seeds.DAY34_BLOCK, num_slots=seeds.DAY34_SLOTS, **mode
    )


@pytest.fixture(scope="module")
def sweeps(model: llmengine.Llama) -> dict[str, list[PoolResult]]:
    """The two tightest pools of the sweep, under each mode."""
    return {
        "recompute": day34_sweep(model, [12, 8]),
        "swap": day34_sweep(model, [12, 8], preemption="swap", swap_blocks=ROOMY_SWAP),
    }


@pytest.fixture(scope="module")
def at_12(sweeps: dict[str, list[PoolResult]]) -> dict[str, PoolResult]:
    return {mode: results[0] for mode, results in sweeps.items()}


# -- measured on this CPU ------------------------------------------------------------------


def test_under_swap_every_position_is_computed_once_and_the_text_is_the_same(
    sweeps: dict[str, list[PoolResult]],
) -> None:
    once = seeds.DAY34_REQUESTS * (seeds.DAY34_PROMPT + seeds.DAY34_BUDGET - 1)
    reference = sweeps["recompute"][0].outputs
    for by_recompute, by_swap in zip(sweeps["recompute"], sweeps["swap"], strict=True):
        assert by_swap.outputs == by_recompute.outputs == reference
        assert (
            by_swap.timing.total_forward_tokens == once < by_recompute.timing.total_forward_tokens
        )
        assert by_swap.timing.total_recomputed_tokens == 0
        # Every eviction went to host memory and came back from it.
        assert by_swap.timing.swap_outs == by_swap.timing.swap_ins == by_swap.timing.preemptions
    assert sweeps["recompute"][0].timing.total_forward_tokens == seeds.DAY34_FORWARD_POSITIONS[12]
    assert once == seeds.DAY34_FORWARD_POSITIONS[48]


def test_bytes_moved_are_blocks_copied_times_bytes_per_block(
    model: llmengine.Llama, at_12: dict[str, PoolResult]
) -> None:
    timing = at_12["swap"].timing
    assert timing.total_blocks_swapped_out == timing.total_blocks_swapped_in > 0
    per_block = seeds.DAY34_BLOCK * kv_bytes_per_position(model.config, torch.float32)
    assert timing.bytes_per_block == per_block
    moved = timing.total_blocks_swapped_out + timing.total_blocks_swapped_in
    assert timing.bytes_swapped == moved * per_block
    assert at_12["recompute"].timing.bytes_swapped == 0


def test_swap_space_high_water_is_the_smallest_space_with_no_fallback(
    model: llmengine.Llama, at_12: dict[str, PoolResult]
) -> None:
    high_water = swap_space_high_water(at_12["swap"].run.outcomes)
    booked_after_decisions = max(o.held_swap_blocks for o in at_12["swap"].run.outcomes)
    assert high_water > booked_after_decisions  # a victim left before another came back
    for blocks, fallbacks in ((high_water, False), (high_water - 1, True)):
        result = day34_sweep(model, [12], preemption="swap", swap_blocks=blocks)[0]
        assert (result.timing.recompute_preemptions > 0) is fallbacks
        assert result.outputs == at_12["recompute"].outputs
    assert swap_space_high_water([]) == 0


def test_a_small_swap_space_mixes_both_modes_with_the_same_text(
    model: llmengine.Llama, at_12: dict[str, PoolResult]
) -> None:
    recomputed = []
    for blocks in (4, 16):
        timing = day34_sweep(model, [12], preemption="swap", swap_blocks=blocks)[0].timing
        assert timing.swap_outs > 0 and timing.recompute_preemptions > 0
        recomputed.append(timing.total_recomputed_tokens)
    full = at_12["recompute"].timing.total_recomputed_tokens
    assert full > recomputed[0] > recomputed[1] > 0


def test_victims_are_not_faster_under_swap_because_of_the_return_order(
    at_12: dict[str, PoolResult],
) -> None:
    recompute, swap = at_12["recompute"], at_12["swap"]
    assert recompute.timing.iterations == swap.timing.iterations
    assert recompute.timing.mean_latency_iterations == seeds.DAY34_MEAN_LATENCY_AT_12
    victims = {mode: victim_latencies(result)[0] for mode, result in at_12.items()}
    assert sum(victims["swap"]) > sum(victims["recompute"])
    assert swap.timing.mean_latency_iterations > recompute.timing.mean_latency_iterations
    # Swap brings victims back first out, first in: the youngest, evicted first, returns first.
    left = [rid for o in swap.run.outcomes for rid in o.swapped_out]
    back = [rid for o in swap.run.outcomes for rid in o.swapped_in]
    assert back == left and left[0] == swap.run.request_ids[-1]
    # Recompute puts each victim at the head of the queue: the oldest victim returns first.
    resumed = [rid for o in recompute.run.outcomes for rid in o.resumed]
    evicted = {rid for o in recompute.run.outcomes for rid in o.evicted}
    oldest_victim = next(rid for rid in recompute.run.request_ids if rid in evicted)
    assert resumed[0] == oldest_victim != left[0]


def test_victim_latencies_split_the_run_by_eviction(at_12: dict[str, PoolResult]) -> None:
    result = at_12["recompute"]
    victims, straight_through = victim_latencies(result)
    assert straight_through == [seeds.DAY34_STAIRCASE_AT_12[0]]
    assert victims == seeds.DAY34_STAIRCASE_AT_12[1:]


def test_the_wall_clock_reading_turns_with_the_numbers() -> None:
    # Seconds that track iterations: per-iteration cost flat, per-position cost spread out.
    by_iterations = wall_clock_reading([5.0, 5.5], [800.0, 1600.0], {"recompute": 0.3, "swap": 0.2})
    assert "follows the iterations more closely than the positions" in by_iterations
    assert "what the model's size predicts" in by_iterations
    assert "the swap run is the shorter" in by_iterations
    by_positions = wall_clock_reading([4.0, 8.0], [900.0, 950.0], {"recompute": 0.2, "swap": 0.3})
    assert "follows the positions more closely than the iterations" in by_positions
    assert "predicts the opposite" in by_positions
    assert "the swap run is not the shorter" in by_positions


# -- the cost model ------------------------------------------------------------------------


def tiny() -> LlamaConfig:
    """A shape to count by hand: width 4, one layer, 2 query heads and 1 KV head of width 2."""
    return LlamaConfig(
        vocab_size=10,
        hidden_size=4,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=2,
        max_position_embeddings=16,
    )


def test_the_cost_model_on_a_shape_counted_by_hand() -> None:
    config = tiny()
    # q 4x4 + k 4x2 + v 4x2 + o 4x4 = 48; MLP 3 x 4x8 = 96.
    assert layer_weights(config) == weights_per_position(config) == 144
    # Three positions: each head at position i does 2 x 2 x (i + 1) for scores and as much for
    # the mix, so 8 + 16 + 24 = 48 per head, 96 for two.
    assert attention_flops(config, 3) == 96
    assert recompute_flops(config, 3) == 2 * 144 * 3 + 96
    assert recompute_flops(config, 3, attention=False) == 864
    # K and V, one head of width 2, one layer, 2 bytes each: 8 bytes a position, out and back.
    assert swap_bytes(config, 3) == 2 * 3 * 8
    gpu = Gpu("one second per recompute", 2 * 960.0, source="test", read_at="test")
    assert recompute_seconds(config, 3, gpu, fraction=0.5) == pytest.approx(1.0)
    assert swap_seconds(config, 3, PCIE4_X16) == pytest.approx(48 / PCIE4_X16.bytes_per_second)
    # 16 GT/s x 16 lanes x 128/130 payload bits / 8 bits per byte.
    assert PCIE4_X16.bytes_per_second == pytest.approx(16e9 * 16 * 128 / 130 / 8)
    assert PCIE5_X16.bytes_per_second == pytest.approx(2 * PCIE4_X16.bytes_per_second)
    # Embedding 10 x 4, untied head 10 x 4, two norms of 4 plus the final one.
    assert parameter_count(config) == 144 + 2 * 40 + 3 * 4


def test_parameter_count_matches_real_checkpoints(model: llmengine.Llama, tmp_path: Path) -> None:
    assert parameter_count(model.config) == sum(p.numel() for p in model.parameters())
    # An untied head, unlike the embedded model's, and then biases on every projection.
    for folder, biases in ((tmp_path / "plain", False), (tmp_path / "biased", True)):
        save_random_llama(folder, seed=4, attention_bias=biases, mlp_bias=biases)
        checkpoint = llmengine.load_model(folder)
        assert not checkpoint.config.tie_word_embeddings
        assert checkpoint.config.attention_bias is checkpoint.config.mlp_bias is biases
        assert parameter_count(checkpoint.config) == sum(p.numel() for p in checkpoint.parameters())
    card_error = parameter_count(LLAMA_3_2_1B.config) / LLAMA_3_2_1B_CARD_PARAMETERS - 1
    assert abs(card_error) < 0.01


def test_without_attention_the_ratio_is_the_same_at_every_length(
    model: llmengine.Llama,
) -> None:
    for config in (model.config, *REAL_MODELS):
        for gpu, link in MACHINES:
            expected = linear_ratio(config, gpu, link)
            with_attention = []
            for context in (1, 100, 10_000, 100_000):
                recompute = recompute_seconds(config, context, gpu, attention=False)
                assert recompute / swap_seconds(config, context, link) == pytest.approx(expected)
                full = recompute_seconds(config, context, gpu)
                with_attention.append(full / swap_seconds(config, context, link))
            # Attention only adds to recompute, and adds more the longer the context.
            assert with_attention == sorted(with_attention)
            assert with_attention[0] > expected


def test_swap_is_cheaper_for_the_real_llamas_on_every_machine() -> None:
    for config in REAL_MODELS:
        for gpu, link in MACHINES:
            assert linear_ratio(config, gpu, link) > 1.0
            assert crossover_context(config, gpu, link) is None
            assert recompute_seconds(config, 1, gpu) > swap_seconds(config, 1, link)


def test_the_embedded_model_crosses_over_beyond_the_context_it_can_hold(
    model: llmengine.Llama,
) -> None:
    config = model.config
    for gpu, link in MACHINES:
        assert linear_ratio(config, gpu, link) < 1.0
        crossover = crossover_context(config, gpu, link)
        assert crossover is not None and crossover > config.max_position_embeddings
        below, above = math.floor(crossover), math.ceil(crossover) + 1
        assert recompute_seconds(config, below, gpu) < swap_seconds(config, below, link)
        assert recompute_seconds(config, above, gpu) > swap_seconds(config, above, link)


# -- the committed tables -------------------------------------------------------------------


def test_the_committed_sweep_table_holds_the_seed_numbers() -> None:
    rows = {
        (row["pool (blocks)"], row["mode"]): row
        for row in read_report_table("swap-vs-recompute-sweep")
    }
    once = seeds.DAY34_REQUESTS * (seeds.DAY34_PROMPT + seeds.DAY34_BUDGET - 1)
    for pool, positions in seeds.DAY34_FORWARD_POSITIONS.items():
        assert int(rows[(str(pool), "recompute")]["forward positions"]) == positions
    assert rows[("12", "recompute")]["recomputed"] == str(seeds.DAY34_RECOMPUTED_AT_12)
    assert float(rows[("12", "recompute")]["mean, all"]) == seeds.DAY34_MEAN_LATENCY_AT_12
    for pool in seeds.DAY34_POOLS:
        swap = rows[(str(pool), "swap")]
        assert int(swap["forward positions"]) == once and swap["recomputed"] == "0"
        assert swap["blocks out"] == swap["blocks in"]


def test_the_committed_ratio_table_says_no_crossover_for_the_real_llamas() -> None:
    rows = read_report_table("preemption-cost-ratio")
    assert len(rows) == 3 * len(MACHINES)
    for row in rows:
        real = row["model"] in (LLAMA_3_2_1B.name, LLAMA_3_1_8B.name)
        assert row["crossover L"].startswith("none") is real
        assert (float(row["recompute / swap (no attention)"]) > 1.0) is real

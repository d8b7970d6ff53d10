"""Lesson 18's exercises: swap against recompute, on the six-request burst and in the GPU
cost model.

Each checker runs the engine on the embedded model (or the lesson's cost model) to find the
right answer, then compares the learner's prediction with it.
"""

from __future__ import annotations

from llmengine.bench.batchbench import PoolResult, sweep_pool_sizes
from llmengine.bench.workloads import uniform_burst
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.preemption_cost import H100_SXM, LLAMA_3_1_8B, PCIE5_X16, linear_ratio

# The lesson's burst: six requests, 5-token prompts, 24 greedy tokens each, blocks of four
# tokens and six slots.
REQUESTS, PROMPT, BUDGET, SEED = 6, 5, 24, 34
BLOCK_SIZE, SLOTS = 4, 6
ROOMY_SWAP = 64
LONGER_PROMPT = 8
LOW_FRACTION = 0.25


def burst_run(pool_blocks: int, prompt: int = PROMPT, **mode: object) -> PoolResult:
    """The lesson's burst, with `prompt`-token prompts, through one engine of `pool_blocks`
    blocks, in the given mode."""
    model = embedded_model()
    burst = uniform_burst(REQUESTS, prompt, BUDGET, vocab_size=model.config.vocab_size, seed=SEED)
    return sweep_pool_sizes(
        model, burst, [pool_blocks], block_size=BLOCK_SIZE, num_slots=SLOTS, **mode
    )[0]


def check_positions_under_swap(
    answer: int | None, pool_blocks: int = 10, prompt: int = LONGER_PROMPT
) -> Verdict:
    """Forward positions the burst computes under swap, with a roomy swap space, at a pool of
    `pool_blocks` blocks (one the lesson's sweep skips) when each prompt has `prompt` tokens
    (not the lesson's five, so the sweep's count does not answer it)."""
    if answer is None:
        return check_value(None, None, what="the forward positions")
    timing = burst_run(pool_blocks, prompt, preemption="swap", swap_blocks=ROOMY_SWAP).timing
    return check_value(
        answer,
        timing.total_forward_tokens,
        what=f"the forward positions under swap at {pool_blocks} blocks, {prompt}-token prompts",
        explain=(
            f"{timing.swap_outs} swap-outs and nothing recomputed: every prompt position and "
            "every generated token but the last is computed once, whatever the pool."
        ),
    )


def check_recomputed_without_swap_space(answer: int | None, pool_blocks: int = 20) -> Verdict:
    """Positions recomputed under `preemption="swap"` with `swap_blocks=0`, at a pool the
    lesson's sweep does not run."""
    if answer is None:
        return check_value(None, None, what="the recomputed positions")
    timing = burst_run(pool_blocks, preemption="swap", swap_blocks=0).timing
    return check_value(
        answer,
        timing.total_recomputed_tokens,
        what=f"the positions recomputed at {pool_blocks} blocks with no swap space",
        explain=(
            f"All {timing.recompute_preemptions} evictions fall back to recompute, so the run is "
            "a recompute run at this pool, eviction for eviction."
        ),
    )


def check_ratio_at_a_lower_prefill_rate(answer: float | None) -> Verdict:
    """Recompute over swap, attention left out, for Llama 3.1 8B on an H100 with PCIe 5.0,
    when the prefill reaches only a quarter of the dense bf16 peak (within 5%)."""
    config = LLAMA_3_1_8B.config
    expected = round(linear_ratio(config, H100_SXM, PCIE5_X16, fraction=LOW_FRACTION), 2)
    return check_value(
        answer,
        expected,
        what=f"recompute / swap at {LOW_FRACTION:.0%} of peak",
        tolerance=0.05,
        explain=(
            "Recompute seconds are FLOPs over the achieved rate, so halving the rate doubles "
            "them; swap seconds do not move, and the ratio doubles with them."
        ),
    )

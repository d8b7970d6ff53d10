"""Lesson 14's exercises: the recompute bill, counted in positions on the engine.

The workload is the lesson's: six requests arriving together, the first five tokens of six
lines of the play as prompts, greedy with no early stop, six slots. Every answer is computed by
running the engine on the embedded model.
"""

from __future__ import annotations

from functools import cache

import llmengine
from llmengine.bench.batchbench import PoolResult
from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value, check_with, embedded_model

OPENING_LINES = (
    "ROMEO:\nBut soft, what light",
    "JULIET:\nO Romeo, Romeo",
    "HAMLET:\nTo be, or not",
    "KING LEAR:\nBlow, winds, and",
    "MACBETH:\nIs this a dagger",
    "PORTIA:\nThe quality of mercy",
)
BUDGET = 24
CHOICES = ("more", "fewer", "the same")


def burst(max_tokens: int = BUDGET) -> list[RequestSpec]:
    """The lesson's six requests, each allowed `max_tokens`."""
    tokenizer = llmengine.load_tokenizer()
    params = llmengine.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [RequestSpec(tuple(tokenizer.encode(line)[:5]), params) for line in OPENING_LINES]


@cache
def run_in_pool(pool_blocks: int, block_size: int = 4, max_tokens: int = BUDGET) -> PoolResult:
    """The six requests through one engine of `pool_blocks` blocks of `block_size` tokens."""
    (result,) = llmengine.sweep_pool_sizes(
        embedded_model(),
        burst(max_tokens),
        [pool_blocks],
        block_size=block_size,
        num_slots=len(OPENING_LINES),
    )
    return result


def check_forward_positions_with_16_tokens(answer: int | None) -> Verdict:
    """Exercise 1: each request allowed 16 tokens, the 48-block pool that evicts nobody: the
    positions the run's forwards compute."""
    what = "the forward positions with 16 tokens each at 48 blocks"
    if answer is None:
        return check_value(None, None, what=what)
    timing = run_in_pool(48, max_tokens=16).timing
    return check_value(
        answer,
        timing.total_forward_tokens,
        what=what,
        explain=f"{timing.preemptions} evictions: each request computes its 5-token prompt once "
        "and then one position per decode, and its last token is never fed back.",
    )


def check_first_time_positions_at_16_blocks(answer: int | None) -> Verdict:
    """Exercise 2: of the positions counted as recomputed at 16 blocks, how many are computed
    for the first time (the newest token of each resumed prefill)?"""
    what = "the positions at 16 blocks counted as recomputed but computed for the first time"
    if answer is None:
        return check_value(None, None, what=what)
    result = run_in_pool(16)
    resumes = sum(len(outcome.resumed) for outcome in result.run.outcomes)
    return check_value(
        answer,
        resumes,
        what=what,
        explain=f"One per resumed prefill, and the run resumes {resumes} times: once per eviction.",
    )


def check_recompute_with_blocks_of_2(answer: str | None) -> Verdict:
    """Exercise 3: the same 48 tokens of pool as 24 blocks of 2 instead of 12 of 4: does the
    run recompute more positions, fewer, or the same?"""

    def judge(choice: str) -> tuple[bool, str]:
        if choice not in CHOICES:
            return False, f"answer one of {', '.join(map(repr, CHOICES))}."
        fours = run_in_pool(12, block_size=4).timing
        twos = run_in_pool(24, block_size=2).timing
        before, after = fours.total_recomputed_tokens, twos.total_recomputed_tokens
        observed = "more" if after > before else "fewer" if after < before else "the same"
        return choice == observed, (
            f"With blocks of 2 the run recomputes {after} positions ({twos.preemptions} "
            f"evictions), against {before} ({fours.preemptions} evictions) with blocks of 4: "
            f"{observed}."
        )

    return check_with(answer, judge, what="more, fewer or the same recomputed positions")

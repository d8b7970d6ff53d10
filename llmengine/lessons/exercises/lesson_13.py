"""Lesson 13's exercises: blocks bought a step at a time, and when the pool runs dry.

The workload of the last two is the lesson's: four requests arriving together, the first five
tokens of four lines of the play as prompts, 24 tokens each with no early stop, four slots,
blocks of 4 tokens, `policy="incremental"`. Every answer is computed by the scheduler or the
engine on the embedded model.
"""

from __future__ import annotations

from functools import cache

import llmengine
from llmengine.bench.batchbench import PoolResult
from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.incremental_figure import blocks_held_per_forward

OPENING_LINES = (
    "ROMEO:\nBut soft, what light",
    "JULIET:\nO Romeo, Romeo",
    "HAMLET:\nTo be, or not",
    "KING LEAR:\nBlow, winds, and",
)
BLOCK_SIZE, BUDGET, ROOMY_POOL = 4, 24, 32


def burst() -> list[RequestSpec]:
    """The lesson's four requests."""
    tokenizer = llmengine.load_tokenizer()
    params = llmengine.SamplingParams(max_tokens=BUDGET, ignore_eos=True)
    return [RequestSpec(tuple(tokenizer.encode(line)[:5]), params) for line in OPENING_LINES]


@cache
def run_in_pool(pool_blocks: int) -> PoolResult:
    """The burst through one engine with `pool_blocks` blocks, incremental allocation."""
    (result,) = llmengine.sweep_pool_sizes(
        embedded_model(),
        burst(),
        [pool_blocks],
        block_size=BLOCK_SIZE,
        num_slots=len(OPENING_LINES),
        policy="incremental",
    )
    return result


def smallest_pool_never_evicting() -> int:
    """Pools tried downward from the roomy one: the last before the first that evicts."""
    pool = ROOMY_POOL
    while pool > 1 and not run_in_pool(pool - 1).timing.preemptions:
        pool -= 1
    return pool


def check_blocks_at_the_last_forward(answer: int | None) -> Verdict:
    """Exercise 1: a lone request, 5-token prompt, `max_tokens=20`, blocks of 4, incremental:
    the blocks it holds in the forward that samples its last token."""
    what = "the blocks held in the last forward (prompt 5, 20 tokens, blocks of 4)"
    if answer is None:
        return check_value(None, None, what=what)
    held = blocks_held_per_forward("incremental", 5, 20, BLOCK_SIZE)
    reserved = blocks_held_per_forward("reserve", 5, 20, BLOCK_SIZE)[-1]
    return check_value(
        answer,
        held[-1],
        what=what,
        explain=f"Its last forward runs with 5 + 19 tokens: the 20th is sampled there and never "
        f"written. The reserve rule would have held {reserved} from the start.",
    )


def check_smallest_pool_never_evicting(answer: int | None) -> Verdict:
    """Exercise 2: the smallest pool (blocks) in which the four requests run to the end under
    incremental allocation with nobody evicted."""
    what = "the smallest pool with no eviction (four requests, incremental)"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        smallest_pool_never_evicting(),
        what=what,
        explain="The four grow in step, and in their last forward each holds the blocks of "
        "5 + 23 tokens; one block fewer and the youngest is evicted.",
    )


def check_iteration_of_the_eviction(answer: int | None) -> Verdict:
    """Exercise 3: in the 96-token pool (24 blocks), the iteration whose scheduling evicts."""
    what = "the iteration of the eviction in the 96-token pool"
    if answer is None:
        return check_value(None, None, what=what)
    result = run_in_pool(24)
    evictions = [
        (iteration, index)
        for index, request_id in enumerate(result.run.request_ids)
        for iteration in result.timing.preempted_at.get(request_id, [])
    ]
    (iteration, victim), *_ = sorted(evictions)
    return check_value(
        answer,
        iteration,
        what=what,
        explain=f"The four requests hold 4 × 6 = 24 blocks until one of them needs a seventh; "
        f"the victim is r{victim}, the youngest.",
    )

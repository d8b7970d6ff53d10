"""Lesson 12's exercises: what the worst-case rule books, checked on the engine.

The workload is the lesson's burst: eight requests arriving together with 5-token prompts,
seven allowed 4 tokens and the first allowed more, eight slots. Every answer is computed by
running the engine on the embedded model.
"""

from __future__ import annotations

import itertools
from functools import cache

import llmengine
from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value, embedded_model

NUM_SLOTS, PROMPT_TOKENS, SHORT_BUDGET = 8, 5, 4


def burst(long_budget: int = 32) -> list[RequestSpec]:
    """The lesson's burst, its first request allowed `long_budget` tokens."""
    model = embedded_model()
    requests = llmengine.uniform_burst(
        NUM_SLOTS, PROMPT_TOKENS, 1, vocab_size=model.config.vocab_size, seed=29
    )
    return llmengine.with_budgets(requests, [long_budget] + [SHORT_BUDGET] * (NUM_SLOTS - 1))


def first_forward_rows(
    pool_blocks: int, *, policy: str = "reserve", block_size: int = 4, long_budget: int = 32
) -> int:
    """How many requests of the burst the engine's first forward runs, on one step."""
    engine = llmengine.Engine(
        embedded_model(),
        num_blocks=pool_blocks,
        block_size=block_size,
        num_slots=NUM_SLOTS,
        policy=policy,
    )
    for spec in burst(long_budget):
        engine.add_request(list(spec.prompt_token_ids), spec.params)
    return engine.step().rows


@cache
def smallest_pool_running_all(policy: str, block_size: int) -> int:
    """The smallest pool (blocks) that runs the whole burst at once with nobody evicted.

    Pools are tried upward from the door check's minimum, one step each; a pool whose first
    forward runs everybody is then run to the end, and counts once nobody was evicted.
    """
    workload = burst()
    door = max(
        llmengine.blocks_for_length(len(spec.prompt_token_ids) + spec.params.max_tokens, block_size)
        for spec in workload
    )
    for pool in itertools.count(door):
        if first_forward_rows(pool, policy=policy, block_size=block_size) < len(workload):
            continue
        result = llmengine.sweep_pool_sizes(
            embedded_model(),
            workload,
            [pool],
            block_size=block_size,
            num_slots=NUM_SLOTS,
            policy=policy,
        )
        if llmengine.smallest_pool_running_all(result) == pool:
            return pool
    raise AssertionError("unreachable: itertools.count never ends")


def check_first_forward_with_a_shorter_long_request(answer: int | None) -> Verdict:
    """Exercise 1: the long request allowed 16 tokens, a 20-block pool, `policy="reserve"`:
    how many requests does the first forward run?"""
    what = "the requests in the first forward (long budget 16, 20 blocks, reserve)"
    if answer is None:
        return check_value(None, None, what=what)
    expected = first_forward_rows(20, long_budget=16)
    long_books = llmengine.blocks_for_length(PROMPT_TOKENS + 16, 4)
    short_books = llmengine.blocks_for_length(PROMPT_TOKENS + SHORT_BUDGET, 4)
    return check_value(
        answer,
        expected,
        what=what,
        explain=f"The long request books {long_books} blocks, each short one {short_books}: "
        f"{long_books} + {expected - 1} × {short_books} = "
        f"{long_books + (expected - 1) * short_books} fit in 20, one more would not.",
    )


def check_smallest_reserve_pool_with_blocks_of_8(answer: int | None) -> Verdict:
    """Exercise 2: blocks of 8 tokens: the smallest pool in which the reserve rule runs the
    whole burst at once."""
    what = "the smallest pool running all eight at once (reserve, blocks of 8)"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        smallest_pool_running_all("reserve", 8),
        what=what,
        explain="Each short request books its 9 tokens, one block of 8 and a second for the "
        "ninth; the long one books its 37 tokens.",
    )


def check_smallest_incremental_pool_with_blocks_of_8(answer: int | None) -> Verdict:
    """Exercise 3: blocks of 8 tokens: the smallest pool in which the incremental rule runs
    the whole burst at once, with nobody evicted."""
    what = "the smallest pool running all eight at once (incremental, blocks of 8)"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        smallest_pool_running_all("incremental", 8),
        what=what,
        explain="Each 5-token prompt fits one block, and the short requests finish before "
        "the long one needs its second.",
    )

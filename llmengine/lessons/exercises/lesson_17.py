"""Lesson 17's exercises: vLLM's rounding, the door under a watermark, and how many requests the
lookahead reserve lets in. Each check finds the right answer with the lesson's own functions
or the engine on the embedded model."""

from __future__ import annotations

import itertools

from llmengine.engine import Engine
from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.lookahead import LookaheadEngine
from llmengine.lessons.watermarks import vllm_watermark_blocks
from llmengine.sampling import SamplingParams

BLOCK_SIZE = 4


def smallest_pool_for_watermark(blocks: int) -> int:
    """The smallest pool on which vLLM's 1% rule, rounded down, comes to `blocks` blocks."""
    return next(pool for pool in itertools.count(1) if vllm_watermark_blocks(pool) >= blocks)


def check_smallest_pool_for_three_blocks(answer: int | None) -> Verdict:
    """Exercise 1: the smallest pool whose vLLM watermark is 3 blocks."""
    pool = smallest_pool_for_watermark(3)
    return check_value(
        answer,
        pool,
        what="the smallest pool on which vLLM's 1% watermark is 3 blocks",
        explain=f"int(0.01 * {pool}) = {vllm_watermark_blocks(pool)}, and int(0.01 * "
        f"{pool - 1}) = {vllm_watermark_blocks(pool - 1)}: the rule rounds down.",
    )


def largest_watermark_the_door_admits(num_blocks: int, prompt: int, budget: int) -> int:
    """The largest watermark with which the engine's door takes a request of `prompt` tokens and
    `budget` more, found by asking `add_request` (-1 when even watermark 0 refuses it)."""
    params = SamplingParams(max_tokens=budget, ignore_eos=True)
    largest = -1
    for watermark in range(num_blocks):
        engine = Engine(
            embedded_model(),
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            num_slots=1,
            watermark=watermark,
        )
        try:
            engine.add_request(list(range(2, 2 + prompt)), params)
        except ValueError:
            break
        largest = watermark
    return largest


def check_largest_watermark_for_ten_blocks(answer: int | None) -> Verdict:
    """Exercise 2: the burst's requests (5 + 24 tokens) in a pool of 10 blocks of 4."""
    num_blocks, prompt, budget = 10, 5, 24
    worst = blocks_for_length(prompt + budget, BLOCK_SIZE)
    return check_value(
        answer,
        largest_watermark_the_door_admits(num_blocks, prompt, budget),
        what="the largest watermark a pool of 10 blocks admits the burst's requests with",
        explain=f"A request of {prompt} + {budget} tokens needs up to {worst} blocks of "
        f"{BLOCK_SIZE}, and the door asks for them in the {num_blocks} blocks less the watermark.",
    )


def admitted_by_the_reserve(num_requests: int, num_blocks: int, prompt: int = 8) -> int:
    """How many of `num_requests` requests with `prompt`-token prompts the lookahead reserve
    admits in the first iteration, one slot each, on the real engine."""
    engine = LookaheadEngine(
        embedded_model(), num_blocks=num_blocks, block_size=BLOCK_SIZE, num_slots=num_requests
    )
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for _ in range(num_requests):
        engine.add_request(list(range(2, 2 + prompt)), params)
    return len(engine.step().admitted)


def check_admitted_by_the_reserve(answer: int | None) -> Verdict:
    """Exercise 3: six 8-token prompts, six slots, 16 blocks of 4: admitted in iteration 1."""
    admitted = admitted_by_the_reserve(6, 16)
    return check_value(
        answer,
        admitted,
        what="requests the lookahead reserve admits in the first iteration (6 requests, 16 blocks)",
        explain=f"Each prompt takes 2 blocks, and the k-th admission must leave k free: after "
        f"{admitted} admissions {16 - 2 * admitted} blocks are free, and one more would leave "
        f"{16 - 2 * (admitted + 1)}, short of the {admitted + 1} it must keep.",
    )

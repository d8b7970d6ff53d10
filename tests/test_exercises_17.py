"""Lesson 17's exercise checks: each right answer, found here by a second route, is accepted,
a wrong one is not, and a blank one is unanswered."""

from __future__ import annotations

import math

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises import lesson_17
from llmengine.lessons.lookahead import LookaheadScheduler
from llmengine.params import SamplingParams
from llmengine.scheduling.request import Request


def test_smallest_pool_for_three_blocks() -> None:
    # vLLM rounds 1% of the pool down, so 3 blocks need a pool of at least 3 / 0.01 blocks.
    right = math.ceil(3 / 0.01)
    assert lesson_17.check_smallest_pool_for_three_blocks(right).right is True
    assert lesson_17.check_smallest_pool_for_three_blocks(right - 1).right is False
    assert lesson_17.check_smallest_pool_for_three_blocks(None).right is None


def test_largest_watermark_for_ten_blocks() -> None:
    # The door: the worst case must fit in the pool less the watermark.
    right = 10 - blocks_for_length(5 + 24, lesson_17.BLOCK_SIZE)
    assert lesson_17.check_largest_watermark_for_ten_blocks(right).right is True
    assert lesson_17.check_largest_watermark_for_ten_blocks(right + 1).right is False
    assert lesson_17.check_largest_watermark_for_ten_blocks(None).right is None


def test_admitted_by_the_reserve() -> None:
    # The second route: the reserve's scheduler alone, on integers, without the model.
    scheduler = LookaheadScheduler(num_blocks=16, block_size=lesson_17.BLOCK_SIZE, num_slots=6)
    for request_id in range(6):
        scheduler.add(
            Request(
                request_id=request_id,
                prompt_token_ids=[1] * 8,
                params=SamplingParams(max_tokens=16, ignore_eos=True),
                arrival=request_id,
                block_size=lesson_17.BLOCK_SIZE,
            )
        )
    right = len(scheduler.schedule().admitted)
    assert lesson_17.check_admitted_by_the_reserve(right).right is True
    assert lesson_17.check_admitted_by_the_reserve(right - 1).right is False
    assert lesson_17.check_admitted_by_the_reserve(None).right is None

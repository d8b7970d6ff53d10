"""Lesson 15's exercise checks: each right answer, found here by a second route, is accepted,
a wrong one is not, and a blank one is unanswered."""

from __future__ import annotations

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises import lesson_15
from llmengine.lessons.victim_rules import run_rule
from llmengine.scheduling.scheduler import Scheduler

BLOCK = lesson_15.BLOCK_SIZE


def test_blocks_for_an_eleven_token_prompt() -> None:
    # The prefill writes positions 0..10, the first decode position 11.
    right = (blocks_for_length(11, BLOCK), blocks_for_length(12, BLOCK))
    assert lesson_15.check_blocks_for_an_eleven_token_prompt(right).right is True
    assert lesson_15.check_blocks_for_an_eleven_token_prompt((3, 4)).right is False
    assert lesson_15.check_blocks_for_an_eleven_token_prompt(None).right is None


def test_largest_budget_through_the_door() -> None:
    right = 6 * BLOCK - 7  # the worst case, prompt plus budget, fills the empty pool exactly
    assert lesson_15.check_largest_budget_through_the_door(right).right is True
    assert lesson_15.check_largest_budget_through_the_door(right + 1).right is False
    assert lesson_15.check_largest_budget_through_the_door(None).right is None


def test_smallest_pool_without_evictions() -> None:
    # The second route: the same scheduler on counts alone, with a fake forward (lesson 16's
    # driver). With no early stop, what the scheduler decides does not depend on the tokens.
    specs = [
        (len(spec.prompt_token_ids), spec.params.max_tokens) for spec in lesson_15.first_twelve()
    ]
    smallest_admitting = max(blocks_for_length(p + b, BLOCK) for p, b in specs)
    evictions = {
        pool: len(run_rule(Scheduler, specs, pool, BLOCK, lesson_15.SLOTS).evictions)
        for pool in range(smallest_admitting, 64)
    }
    right = min(pool for pool, count in evictions.items() if count == 0)
    # Every pool from there on is free of evictions, so "smallest" has one answer.
    assert all(evictions[pool] == 0 for pool in range(right, 64))
    assert lesson_15.check_smallest_pool_without_evictions(right).right is True
    assert lesson_15.check_smallest_pool_without_evictions(right - 1).right is False
    assert lesson_15.check_smallest_pool_without_evictions(None).right is None

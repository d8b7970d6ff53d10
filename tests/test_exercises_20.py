"""Lesson 20's exercises: each checker accepts the right answer, found here by another route,
refuses a wrong one, and leaves a blank one unanswered."""

from __future__ import annotations

import math

import llmengine
from llmengine.lessons.exercises import lesson_20
from llmengine.server.protocol import MAX_CHOICES


def test_equal_requests_are_served_in_waves_of_the_slots() -> None:
    slots = 6
    right = math.ceil(lesson_20.REQUESTS / slots)
    assert lesson_20.check_waves_with_slots(right, slots).right is True
    assert lesson_20.check_waves_with_slots(right + 1, slots).right is False
    assert lesson_20.check_waves_with_slots(None, slots).right is None


def test_reserve_runs_as_many_as_the_pool_holds_worst_cases() -> None:
    worst = llmengine.blocks_for_length(
        lesson_20.PROMPT_LEN + lesson_20.LONG_BUDGET, lesson_20.BLOCK_SIZE
    )
    right = lesson_20.CRAMPED_BLOCKS // worst
    assert right < lesson_20.CRAMPED_SLOTS  # the pool, not the slots, is the limit
    assert lesson_20.check_reserve_with_longer_budgets(right).right is True
    assert lesson_20.check_reserve_with_longer_budgets(4).right is False
    assert lesson_20.check_reserve_with_longer_budgets(None).right is None


def test_one_request_carries_at_most_the_choices_limit() -> None:
    right = MAX_CHOICES // lesson_20.CHOICES_N
    assert lesson_20.check_most_prompts_in_one_request(right).right is True
    assert lesson_20.check_most_prompts_in_one_request(right - 1).right is False
    assert lesson_20.check_most_prompts_in_one_request(None).right is None

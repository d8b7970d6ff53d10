"""Lesson 13's exercise checkers: the right answer, worked out here from block arithmetic, is
right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from llmengine import blocks_for_length
from llmengine.lessons.exercises.lesson_13 import (
    check_blocks_at_the_last_forward,
    check_iteration_of_the_eviction,
    check_smallest_pool_never_evicting,
)


def test_blocks_at_the_last_forward() -> None:
    # The last forward writes the prompt and the 19 tokens before the last one.
    expected = blocks_for_length(5 + 19, 4)
    assert expected == 6
    assert check_blocks_at_the_last_forward(expected).right is True
    assert check_blocks_at_the_last_forward(blocks_for_length(5 + 20, 4)).right is False
    assert check_blocks_at_the_last_forward(None).right is None


def test_smallest_pool_never_evicting() -> None:
    expected = 4 * blocks_for_length(5 + 23, 4)
    assert expected == 28
    assert check_smallest_pool_never_evicting(expected).right is True
    assert check_smallest_pool_never_evicting(32).right is False
    assert check_smallest_pool_never_evicting(None).right is None


def test_iteration_of_the_eviction() -> None:
    # In iteration s each of the four runs with 5 + s - 1 tokens, all four in step: the pool
    # runs dry at the first s where the four together need more than its 24 blocks.
    expected = next(s for s in range(1, 25) if 4 * blocks_for_length(5 + s - 1, 4) > 24)
    assert expected == 21
    assert check_iteration_of_the_eviction(expected).right is True
    assert check_iteration_of_the_eviction(17).right is False
    assert check_iteration_of_the_eviction(None).right is None

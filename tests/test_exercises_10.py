"""Lesson 10's exercise checkers: the right answer, worked out here from the pool's and the
slots' arithmetic, is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import pytest

from llmengine.lessons.exercises.lesson_10 import check_finish_iteration, check_largest_budget


@pytest.mark.parametrize(("prompt", "blocks", "block_size"), [(5, 8, 4), (3, 4, 8)])
def test_largest_budget(prompt: int, blocks: int, block_size: int) -> None:
    # The door lets in prompt + budget up to every position of the empty pool.
    largest = blocks * block_size - prompt
    assert check_largest_budget(largest, prompt, blocks, block_size).right is True
    assert check_largest_budget(largest + 1, prompt, blocks, block_size).right is False
    assert check_largest_budget(None, prompt, blocks, block_size).right is None


@pytest.mark.parametrize(("slots", "budget"), [(2, 8), (1, 12)])
def test_finish_iteration(slots: int, budget: int) -> None:
    # One token per forward; with one slot request 1 waits for request 0's whole budget.
    expected = budget if slots >= 2 else 2 * budget
    assert check_finish_iteration(expected, slots, budget).right is True
    assert check_finish_iteration(expected + 1, slots, budget).right is False
    assert check_finish_iteration(None, slots, budget).right is None

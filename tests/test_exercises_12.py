"""Lesson 12's exercise checkers: the right answer, worked out here from the blocks each rule
books, is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from llmengine import blocks_for_length
from llmengine.lessons.exercises.lesson_12 import (
    check_first_forward_with_a_shorter_long_request,
    check_smallest_incremental_pool_with_blocks_of_8,
    check_smallest_reserve_pool_with_blocks_of_8,
)


def test_first_forward_with_a_shorter_long_request() -> None:
    # The long request (first in the queue) books 5 + 16 tokens, each short one 5 + 4.
    pool, long_books, short_books = 20, blocks_for_length(21, 4), blocks_for_length(9, 4)
    expected = 1 + (pool - long_books) // short_books
    assert expected == 5
    assert check_first_forward_with_a_shorter_long_request(expected).right is True
    assert check_first_forward_with_a_shorter_long_request(8).right is False
    assert check_first_forward_with_a_shorter_long_request(None).right is None


def test_smallest_reserve_pool_with_blocks_of_8() -> None:
    expected = 7 * blocks_for_length(5 + 4, 8) + blocks_for_length(5 + 32, 8)
    assert expected == 19
    assert check_smallest_reserve_pool_with_blocks_of_8(expected).right is True
    assert check_smallest_reserve_pool_with_blocks_of_8(31).right is False
    assert check_smallest_reserve_pool_with_blocks_of_8(None).right is None


def test_smallest_incremental_pool_with_blocks_of_8() -> None:
    # Prompts only: the short requests leave before the long one crosses into a second block.
    expected = 8 * blocks_for_length(5, 8)
    assert check_smallest_incremental_pool_with_blocks_of_8(expected).right is True
    assert check_smallest_incremental_pool_with_blocks_of_8(16).right is False
    assert check_smallest_incremental_pool_with_blocks_of_8(None).right is None

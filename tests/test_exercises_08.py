"""Lesson 08's exercise checkers: the right answer, worked out here by another route, is
right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import random

import pytest

from llmengine.lessons.exercises.lesson_08 import (
    check_tail_of_one_sequence,
    check_waste_at_block_size,
)


@pytest.mark.parametrize(("length", "block_size"), [(100, 16), (64, 16), (1, 8)])
def test_tail_of_one_sequence(length: int, block_size: int) -> None:
    tail = -length % block_size  # the positions from the length up to the next multiple
    assert check_tail_of_one_sequence(tail, length, block_size).right is True
    assert check_tail_of_one_sequence(tail + 1, length, block_size).right is False
    assert check_tail_of_one_sequence(None, length, block_size).right is None


def test_waste_at_block_size() -> None:
    lengths = [random.Random(8).randint(1, 500) for _ in range(100)]
    block_size = 128
    empty = sum(-length % block_size for length in lengths)
    percent = 100 * empty / (sum(lengths) + empty)
    assert check_waste_at_block_size(percent, lengths, block_size).right is True
    assert check_waste_at_block_size(1.05 * percent, lengths, block_size).right is True
    assert check_waste_at_block_size(1.2 * percent, lengths, block_size).right is False
    assert check_waste_at_block_size(None, lengths, block_size).right is None

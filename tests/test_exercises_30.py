"""Lesson 30's exercises: each checker right on the answer the rules give, wrong on another,
unanswered on None. The right answers are computed here from the rules (only whole blocks
inside the shared prefix are taken; the first turn's K/V covers its prompt and all but its
last generated token; a block of the embedded model holds 2 x 4 layers x 4 heads x 32 values
per token), not by the checkers' own engine runs."""

from __future__ import annotations

from llmengine.lessons.exercises.lesson_30 import (
    check_blocks_in_budget,
    check_second_turn,
    check_shared_prefix,
)


def test_shared_prefix() -> None:
    for shared, own, block_size in ((45, 15, 8), (37, 13, 16)):
        right = shared // block_size * block_size
        assert check_shared_prefix(right, shared, own, block_size).right is True
        assert check_shared_prefix(shared, shared, own, block_size).right is False
    assert check_shared_prefix(None).right is None


def test_second_turn() -> None:
    written = 40 + 20 - 1  # the prompt and every generated token but the last
    right = written // 16 * 16
    assert check_second_turn(right, 40, 20, 10, 16).right is True
    assert check_second_turn(written, 40, 20, 10, 16).right is False
    assert check_second_turn(None).right is None


def test_blocks_in_budget() -> None:
    for dtype, value_bytes in (("bfloat16", 2), ("float32", 4)):
        block_bytes = 16 * 2 * 4 * 4 * 32 * value_bytes
        right = (1 << 20) // block_bytes
        assert check_blocks_in_budget(right, 1, 16, dtype).right is True
        assert check_blocks_in_budget(right + 1, 1, 16, dtype).right is False
    assert check_blocks_in_budget(None).right is None

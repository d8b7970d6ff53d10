"""Lesson 14's exercise checkers: the right answer, worked out here by a second route, is right;
a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from llmengine.lessons.exercises.lesson_14 import (
    OPENING_LINES,
    check_first_time_positions_at_16_blocks,
    check_forward_positions_with_16_tokens,
    check_recompute_with_blocks_of_2,
    run_in_pool,
)


def test_forward_positions_with_16_tokens() -> None:
    # Nobody is evicted: a 5-position prefill and 15 one-position decodes per request.
    expected = len(OPENING_LINES) * (5 + 15)
    assert expected == 120
    assert check_forward_positions_with_16_tokens(expected).right is True
    assert check_forward_positions_with_16_tokens(len(OPENING_LINES) * (5 + 16)).right is False
    assert check_forward_positions_with_16_tokens(None).right is None


def test_first_time_positions_at_16_blocks() -> None:
    # One newest token per resume, one resume per eviction: the timing's eviction count.
    expected = run_in_pool(16).timing.preemptions
    assert expected == 5
    assert check_first_time_positions_at_16_blocks(expected).right is True
    assert check_first_time_positions_at_16_blocks(77).right is False
    assert check_first_time_positions_at_16_blocks(None).right is None


def test_recompute_with_blocks_of_2() -> None:
    # The recomputed positions counted row by row from the resumed prefills of each run.
    recomputed = {
        block_size: sum(
            outcome.row_positions[request_id]
            for outcome in run_in_pool(48 // block_size, block_size=block_size).run.outcomes
            for request_id in outcome.resumed
        )
        for block_size in (4, 2)
    }
    assert recomputed[4] == 107
    expected = "fewer" if recomputed[2] < recomputed[4] else "more"
    assert check_recompute_with_blocks_of_2(expected).right is True
    assert check_recompute_with_blocks_of_2("the same").right is False
    assert check_recompute_with_blocks_of_2("a lot").right is False
    assert check_recompute_with_blocks_of_2(None).right is None

"""Lesson 06's exercise checkers: the right answer, found here another way (the formula, the
lesson's committed table), is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from report_tables import report_rows

from llmengine.lessons.exercises.lesson_06 import (
    check_filled_positions_of_one_row,
    check_filled_share_at_256,
)


def test_filled_positions_of_one_row() -> None:
    expected = 10 + 20 - 1  # the last generated token is never fed back
    assert check_filled_positions_of_one_row(expected).right is True
    assert check_filled_positions_of_one_row(10 + 20).right is False
    assert check_filled_positions_of_one_row(None).right is None


def test_filled_share_at_256() -> None:
    rows = {row[0]: row for row in report_rows("contiguous-cache-rows")}
    filled, requests = int(rows["all"][3]), len(rows) - 1
    expected = filled / (256 * requests)
    assert check_filled_share_at_256(round(expected, 2)).right is True
    assert check_filled_share_at_256(filled / (512 * requests)).right is False
    assert check_filled_share_at_256(None).right is None

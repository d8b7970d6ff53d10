"""Lesson 03's exercise checkers: the right answer, found here another way (the formula, the
lesson's stop-rule report), is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from report_tables import report_rows

from llmengine.lessons.exercises.lesson_03 import (
    check_finish_reason_at_twelve,
    check_plain_loop_positions,
)


def test_plain_loop_positions() -> None:
    prompt, generated = 10, 20
    expected = generated * prompt + generated * (generated - 1) // 2
    assert check_plain_loop_positions(expected).right is True
    assert check_plain_loop_positions(generated * prompt).right is False
    assert check_plain_loop_positions(None).right is None


def test_finish_reason_at_twelve() -> None:
    rows = {row[1]: row[2:4] for row in report_rows("stop-rule")}
    # With 64 tokens allowed the request stops on a newline at token 12; with 12 allowed the
    # budget is spent on that same token, and the budget is the rule checked first.
    assert rows["greedy, max_tokens=64, newline stops"] == ["12", "stop"]
    assert check_finish_reason_at_twelve("length").right is True
    assert check_finish_reason_at_twelve("stop").right is False
    assert check_finish_reason_at_twelve(None).right is None

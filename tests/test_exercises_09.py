"""Lesson 09's exercise checkers: the right answer, worked out here from the workload's shape,
is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

from llmengine.lessons.exercises.lesson_09 import (
    check_engine_rows,
    check_static_iterations_with_slots,
    check_static_rows,
)

BUDGETS = [20] + [4] * 7


def test_static_rows() -> None:
    # One rectangle of eight rows, as many forwards as the longest budget.
    expected = len(BUDGETS) * max(BUDGETS)
    assert check_static_rows(expected, BUDGETS).right is True
    assert check_static_rows(sum(BUDGETS), BUDGETS).right is False
    assert check_static_rows(None, BUDGETS).right is None


def test_engine_rows() -> None:
    # A row per token kept.
    expected = sum(BUDGETS)
    assert check_engine_rows(expected, BUDGETS).right is True
    assert check_engine_rows(len(BUDGETS) * max(BUDGETS), BUDGETS).right is False
    assert check_engine_rows(None, BUDGETS).right is None


def test_static_iterations_with_slots() -> None:
    budgets = ([32] + [4] * 7) * 2
    for slots in (16, 4):
        # Rectangles of `slots` requests in arrival order, each as long as its longest budget.
        expected = sum(max(budgets[i : i + slots]) for i in range(0, len(budgets), slots))
        assert check_static_iterations_with_slots(expected, slots).right is True
        assert check_static_iterations_with_slots(expected - 1, slots).right is False
    assert check_static_iterations_with_slots(None, 16).right is None

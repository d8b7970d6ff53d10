"""Lesson 31's exercises: each checker right on the answer the rules give, wrong on another,
unanswered on None. The right answers are computed here from the rules (dispatch is the
operators times their cost; overlapped, a step takes the longer of its host work and its
forward; a greedy step reads back two numbers a row), not by the checkers' code."""

from __future__ import annotations

from llmengine.lessons.exercises.lesson_31 import (
    check_dispatch_share,
    check_numbers_read_back,
    check_overlapped_rate,
)


def test_dispatch_share() -> None:
    assert check_dispatch_share(300 * 4.5 / 2700).right is True
    assert check_dispatch_share(0.9).right is False
    assert check_dispatch_share(0.25, operators=100, per_operator_us=5.0, step_ms=2.0).right
    assert check_dispatch_share(None).right is None


def test_overlapped_rate() -> None:
    assert check_overlapped_rate(1000 / 1.65).right is True
    assert check_overlapped_rate(1000 / (0.35 + 1.65)).right is False  # the steps' sum
    assert check_overlapped_rate(1000 / 0.8, host_ms=0.8, forward_ms=0.5).right is True
    assert check_overlapped_rate(None).right is None


def test_numbers_read_back() -> None:
    assert check_numbers_read_back(16).right is True
    assert check_numbers_read_back(8).right is False
    assert check_numbers_read_back(8 * 2048).right is False  # the logits
    assert check_numbers_read_back(6, rows=3, vocab=512).right is True
    assert check_numbers_read_back(None).right is None

"""Lesson 11's exercise checkers: the right answer, worked out here from the burst's shape, is
right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import pytest

from llmengine.lessons.exercises.lesson_11 import check_burst_iterations, check_second_wave_ttft


@pytest.mark.parametrize("slots", [12, 16])
def test_burst_iterations(slots: int) -> None:
    # Sixteen requests of 16 tokens: one wave of 16 forwards per `slots` requests.
    expected = -(-16 // slots) * 16
    assert check_burst_iterations(expected, num_slots=slots).right is True
    assert check_burst_iterations(expected + 1, num_slots=slots).right is False
    assert check_burst_iterations(None, num_slots=slots).right is None


def test_second_wave_ttft() -> None:
    # The first wave's last tokens come from forward 10; the second wave's prefill is forward 11.
    budget = 10
    assert check_second_wave_ttft(budget + 1, budget).right is True
    assert check_second_wave_ttft(budget, budget).right is False
    assert check_second_wave_ttft(None, budget).right is None

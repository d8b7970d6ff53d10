"""Lesson 19's exercises: each checker accepts the right answer, found here by another route,
refuses a wrong one, and leaves a blank one unanswered."""

from __future__ import annotations

from llmengine.bench import throughput
from llmengine.lessons.exercises import lesson_19


def test_llmengine_computes_each_position_once() -> None:
    workload = lesson_19.mixed_workload()
    prompts = sum(len(spec.prompt_token_ids) for spec in workload)
    useful = sum(throughput.budgets_of(workload))
    assert (prompts, useful) == (322, 479)  # the lesson's workload table
    right = prompts + useful - len(workload)
    assert lesson_19.check_positions_llmengine_computes(right).right is True
    assert lesson_19.check_positions_llmengine_computes(prompts + useful).right is False
    assert lesson_19.check_positions_llmengine_computes(None).right is None


def test_a_step_launches_about_as_many_operators_whatever_its_rows() -> None:
    at_16 = lesson_19.decode_operators(lesson_19.LESSON_ROWS)  # the lesson's table's count
    assert lesson_19.check_operators_with_fewer_rows(at_16).right is True
    assert lesson_19.check_operators_with_fewer_rows(at_16 // 4).right is False
    assert lesson_19.check_operators_with_fewer_rows(None).right is None


def test_generate_computes_every_row_for_the_longest_budget() -> None:
    budgets = lesson_19.STAIRCASE_BUDGETS
    ratio = len(budgets) * max(budgets) / sum(budgets)  # 256 / 144
    assert lesson_19.check_generate_waste(ratio).right is True
    assert lesson_19.check_generate_waste(1.0).right is False
    assert lesson_19.check_generate_waste(None).right is None

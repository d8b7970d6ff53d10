"""Lesson 22's exercises: each checker right on the answer the scheduler's rule gives, wrong on
another, unanswered on None. The right answers are worked out here by hand from the rule
(decodes first, then the prompt takes what is left of the budget), not from a run."""

from __future__ import annotations

from itertools import accumulate

from llmengine.lessons.chunked_prefill import kv_positions_gathered, prefill_chunks
from llmengine.lessons.exercises.lesson_22 import (
    ARRIVAL,
    LONG,
    budget_run,
    check_chunks,
    check_first_token_iteration,
    check_kv_reads,
)

PROMPT, DECODES = 384, 4


def chunks_by_rule(budget: int) -> list[int]:
    share = budget - DECODES
    return [share] * (PROMPT // share) + ([PROMPT % share] if PROMPT % share else [])


def test_chunks() -> None:
    right = len(chunks_by_rule(48))
    assert right == 9
    assert check_chunks(right, 48).right is True
    assert check_chunks(PROMPT // 48, 48).right is False
    assert check_chunks(None).right is None


def test_first_token_iteration() -> None:
    right = ARRIVAL + len(chunks_by_rule(48))
    assert check_first_token_iteration(right, 48).right is True
    assert check_first_token_iteration(right - 1, 48).right is False
    assert check_first_token_iteration(None).right is None


def test_kv_reads() -> None:
    right = sum(accumulate(chunks_by_rule(48)))
    assert check_kv_reads(right, 48).right is True
    assert check_kv_reads(PROMPT, 48).right is False
    assert check_kv_reads(None).right is None
    # The checker's own count, at the lesson's budget of 128, is its table's 1,128 (read here
    # without a check, so that the lesson printing it is no given-away answer).
    assert kv_positions_gathered(prefill_chunks(budget_run(128), LONG)) == 1128

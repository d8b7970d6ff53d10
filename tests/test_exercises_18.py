"""Lesson 18's exercises: each checker accepts the right answer, found here by another route,
refuses a wrong one, and leaves a blank one unanswered."""

from __future__ import annotations

import pytest
from report_tables import read_report_table

from llmengine.lessons.exercises import lesson_18
from llmengine.lessons.preemption_cost import (
    H100_SXM,
    LLAMA_3_1_8B,
    PCIE5_X16,
    recompute_seconds,
    swap_seconds,
)


def test_positions_under_swap_are_every_position_once() -> None:
    once = lesson_18.REQUESTS * (lesson_18.LONGER_PROMPT + lesson_18.BUDGET - 1)
    assert lesson_18.check_positions_under_swap(once).right is True
    assert lesson_18.check_positions_under_swap(once + 20).right is False
    assert lesson_18.check_positions_under_swap(None).right is None
    # The pool really does evict, all to host memory, or the exercise would ask nothing.
    timing = lesson_18.burst_run(
        10, lesson_18.LONGER_PROMPT, preemption="swap", swap_blocks=lesson_18.ROOMY_SWAP
    ).timing
    assert timing.swap_outs > 0
    assert timing.recompute_preemptions == 0


def test_no_swap_space_recomputes_what_recompute_does() -> None:
    by_recompute = lesson_18.burst_run(20).timing.total_recomputed_tokens
    rows = read_report_table("swap-vs-recompute-sweep")
    assert "20" not in {r["pool (blocks)"] for r in rows}  # the lesson does not print it
    assert by_recompute > 0
    assert lesson_18.check_recomputed_without_swap_space(by_recompute).right is True
    assert lesson_18.check_recomputed_without_swap_space(0).right is False
    assert lesson_18.check_recomputed_without_swap_space(None).right is None


def test_a_quarter_of_peak_doubles_the_ratio() -> None:
    config, context = LLAMA_3_1_8B.config, 1_000
    slower = recompute_seconds(config, context, H100_SXM, fraction=0.25, attention=False)
    ratio = slower / swap_seconds(config, context, PCIE5_X16)
    assert ratio == pytest.approx(2 * 6.783, rel=1e-3)
    assert lesson_18.check_ratio_at_a_lower_prefill_rate(ratio).right is True
    assert lesson_18.check_ratio_at_a_lower_prefill_rate(ratio / 2).right is False
    assert lesson_18.check_ratio_at_a_lower_prefill_rate(None).right is None

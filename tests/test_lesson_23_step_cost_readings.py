"""Lesson 23's sentences about its measurements, on costs and reports made up so that every
word the data chooses can be worked out by hand; and the committed benchmark report read the
way the lesson reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmengine.lessons.step_cost import DecodeCost, PackingTiming
from llmengine.lessons.step_cost_readings import (
    LeadOverGenerate,
    lead_lines,
    leads_over_generate,
    packing_line,
    rate_lines,
    share_lines,
)

BENCH_REPORT = Path(__file__).resolve().parent.parent / "reports/wallclock"


def cost(rows: int, step_s: float, products_s: float) -> DecodeCost:
    return DecodeCost(rows, step_s, products_s, step_flops=100 * rows, product_flops=90 * rows)


def costs_of(small: dict[int, tuple[float, float]], large: dict[int, tuple[float, float]]):
    """Two models, before and after alike: `small` and `large` map rows to (step, products)."""
    return {
        (name, version): {rows: cost(rows, *times) for rows, times in timings.items()}
        for name, timings in (("small", small), ("large", large))
        for version in ("before", "after")
    }


def test_share_lines_name_the_model_whose_products_are_the_larger_share() -> None:
    costs = costs_of({32: (10.0, 4.0)}, {32: (10.0, 7.0)})
    lines = share_lines(costs, ["small", "large"], 32)
    assert lines[0].startswith("- small, 32 rows: the products are 40% of the step before")
    assert "the large model's products are the largest share: 40% for the small" in lines[2]
    assert len(lines) == 3
    disturbed = costs_of({32: (10.0, 4.0)}, {32: (10.0, 11.0)})
    assert "no share at all" in share_lines(disturbed, ["small", "large"], 32)[-1]


def test_rate_lines_say_which_rates_rose_at_every_row_count() -> None:
    rising = {1: (1.0, 0.5), 2: (1.5, 0.75), 4: (2.0, 1.0)}
    dipping = {1: (1.0, 0.5), 2: (1.5, 0.75), 4: (4.0, 2.0)}  # the rate falls at 4 rows
    lines = rate_lines(costs_of(rising, dipping), ["small", "large"])
    assert "rose at every row count added: before step, before products, after step, " in lines[0]
    assert "rose at every row count added: none (of 4)" in lines[1]
    assert "a 4-row step took 2.0x the time of a 1-row step, for 4x the rows" in lines[0]
    assert len(lines) == 2


def test_packing_line_counts_a_small_difference_as_a_tie() -> None:
    timings = [PackingTiming(1, 1.2, 1.0), PackingTiming(2, 1.03, 1.0), PackingTiming(4, 0.8, 1.0)]
    line = packing_line(timings)
    assert "faster than eager at 1 rows, more than 5% slower than eager at 4 rows" in line
    assert "within 5% of eager at 2 rows." in line and "never" not in line
    never_faster = packing_line(timings[1:])
    assert "at no rows" not in never_faster
    assert never_faster.endswith("; it is never more than 5% faster than eager.")


def test_leads_are_read_from_the_useful_tokens_table_only(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text(
        "# Report\n\n## Useful tokens per second\n\n"
        "| model | workload | useful tokens | tokens generate computes | x generate |\n"
        "| --- | --- | ---: | ---: | ---: |\n"
        "| m | uniform burst | 100 | 100 | 1.20 |\n"
        "| m | mixed | 50 | 100 | 1.50 |\n\n"
        "### A subsection\n\n| model | workload | seconds |\n| --- | --- | ---: |\n"
        "| m | mixed | 3.0 |\n\n## Targets\n\nignored\n"
    )
    (lead,) = leads_over_generate(report)
    assert lead == LeadOverGenerate("m", uniform=1.2, mixed=1.5, computed_per_useful=2.0)
    assert lead.mixed_per_position == pytest.approx(0.75)
    (line,) = lead_lines([lead])
    assert "served the uniform burst faster than generate (1.20x)" in line
    assert "llmengine's positions were dearer than generate's" in line
    tie = LeadOverGenerate("t", uniform=1.02, mixed=2.1, computed_per_useful=2.0)
    assert (
        "about as fast as" in lead_lines([tie])[0] and "about the same as" in lead_lines([tie])[0]
    )


def test_the_committed_report_has_a_lead_for_each_of_its_models() -> None:
    leads = leads_over_generate(BENCH_REPORT / "throughput-vs-transformers.md")
    assert [lead.model for lead in leads][0] == "embedded"
    for lead in leads:
        assert lead.computed_per_useful >= 1  # generate never computes fewer than the useful
        assert lead.uniform > 0 and lead.mixed > 0

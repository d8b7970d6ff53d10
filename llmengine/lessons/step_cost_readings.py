"""Lesson 23's sentences about its own measurements, with the words chosen by the numbers.

The lesson times decode steps, their matrix products and one packed weight on whichever
machine runs it, and reads the committed benchmark against transformers. What those numbers
show can change from run to run, so every claim about them is written here from the values:
which share is larger, whether a rate rose at every row count, where packing won, and where
llmengine's lead over `generate` comes from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from llmengine.lessons.step_cost import (
    DecodeCost,
    PackingTiming,
    markdown_column,
    markdown_sections,
)

CostsByModel = Mapping[tuple[str, str], Mapping[int, DecodeCost]]  # (model, version) -> rows


def share_lines(costs: CostsByModel, models: Sequence[str], rows: int) -> list[str]:
    """Per model, the products' share of a `rows`-row step before and after, and the after
    step and products against the before ones; then which model's products are the larger
    share after; and a warning if any share is above 100% (a disturbed measurement)."""
    lines = []
    for name in models:
        before, after = costs[name, "before"][rows], costs[name, "after"][rows]
        lines.append(
            f"- {name}, {rows} rows: the products are {before.products_share:.0%} of the step "
            f"before and {after.products_share:.0%} after; after against before, the step takes "
            f"{after.step_s / before.step_s:.2f}x the time and the products alone "
            f"{after.products_s / before.products_s:.2f}x."
        )
    shares = {name: costs[name, "after"][rows].products_share for name in models}
    largest = max(shares, key=shares.__getitem__)
    others = ", ".join(f"{shares[name]:.0%} for the {name} model" for name in shares)
    lines.append(f"- After, the {largest} model's products are the largest share: {others}.")
    if any(by_rows[rows].products_share > 1 for by_rows in costs.values()):
        lines.append(
            "- A share above 100% is no share at all: the products alone were timed slower "
            "than the whole step, a sign that the machine was busy during that measurement."
        )
    return lines


def _rises(values: Sequence[float]) -> bool:
    return all(earlier < later for earlier, later in pairwise(values))


def rate_lines(costs: CostsByModel, models: Sequence[str]) -> list[str]:
    """Per model: how much of the products-alone roofline its steps reach, the after / before
    seconds by row count, whether each rate rose at every row count added, and how much longer
    the widest step took than the narrowest."""
    lines = []
    for name in models:
        before, after = costs[name, "before"], costs[name, "after"]
        rows = sorted(before)
        reached = [
            c.step_flop_rate / c.products_flop_rate for v in (before, after) for c in v.values()
        ]
        ratios = {
            part: ", ".join(
                f"{r}: {getattr(after[r], part) / getattr(before[r], part):.2f}" for r in rows
            )
            for part in ("products_s", "step_s")
        }
        rising = [
            f"{version} {what}"
            for version, by_rows in (("before", before), ("after", after))
            for what, rate in (("step", "step_flop_rate"), ("products", "products_flop_rate"))
            if _rises([getattr(by_rows[r], rate) for r in rows])
        ]
        widest = after[rows[-1]].step_s / after[rows[0]].step_s
        lines.append(
            f"- {name}: the step reaches {min(reached):.0%} to {max(reached):.0%} of the "
            f"roofline. After / before seconds by rows, products alone: {ratios['products_s']}; "
            f"whole step: {ratios['step_s']}. Rates that rose at every row count added: "
            f"{', '.join(rising) or 'none'} (of 4). After, a {rows[-1]}-row step took "
            f"{widest:.1f}x the time of a {rows[0]}-row step, for {rows[-1] // rows[0]}x the rows."
        )
    if any(c.step_flop_rate > c.products_flop_rate for v in costs.values() for c in v.values()):
        lines.append(
            "- A step above 100% of its roofline is a disturbed measurement, not a fast step: "
            "the products alone were timed slower than the whole step while the machine was busy."
        )
    return lines


def packing_line(timings: Sequence[PackingTiming], margin: float = 0.05) -> str:
    """Where the packed product won, lost or tied (within `margin` either way) in this run."""
    verdicts = {"faster": [], "slower": [], "within": []}
    for timing in timings:
        if timing.speedup > 1 + margin:
            verdicts["faster"].append(timing.rows)
        elif timing.speedup < 1 - margin:
            verdicts["slower"].append(timing.rows)
        else:
            verdicts["within"].append(timing.rows)
    said = {
        "faster": f"more than {margin:.0%} faster than eager",
        "slower": f"more than {margin:.0%} slower than eager",
        "within": f"within {margin:.0%} of eager",
    }
    clauses = [
        f"{said[key]} at {', '.join(map(str, rows))} rows" for key, rows in verdicts.items() if rows
    ]
    never = [said[key] for key, rows in verdicts.items() if not rows]
    line = "In this run the packed product is " + _joined(clauses)
    if never:  # a verdict no row earned is said once, rather than as "at no rows"
        line += f"; it is never {_joined(never, 'or')}"
    return line + "."


def _joined(parts: Sequence[str], last: str = "and") -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} {last} {parts[-1]}"


@dataclass(frozen=True, slots=True)
class LeadOverGenerate:
    """llmengine's throughput over `generate`'s for one model, read from the benchmark."""

    model: str
    uniform: float  # on the uniform burst: both compute full rectangles, a step's cost alone
    mixed: float  # on the mixed workload
    computed_per_useful: float  # positions generate computes per useful token, mixed

    @property
    def mixed_per_position(self) -> float:
        """The mixed lead with the work generate wastes divided out: above 1 when llmengine's
        steps are also cheaper per position computed, below 1 when they are dearer."""
        return self.mixed / self.computed_per_useful


def leads_over_generate(report: str | Path) -> list[LeadOverGenerate]:
    """One `LeadOverGenerate` per model of the benchmark's "Useful tokens per second" table."""
    # The section's own table, before its "###" subsections and their tables.
    section = markdown_sections(report, ["Useful tokens per second"]).split("\n### ")[0]
    columns = ("model", "workload", "useful tokens", "tokens generate computes", "x generate")
    table = list(zip(*(markdown_column(section, column) for column in columns), strict=True))
    leads = []
    for model in dict.fromkeys(row[0] for row in table):
        rows = {row[1]: row for row in table if row[0] == model}
        uniform, mixed = rows["uniform burst"], rows["mixed"]
        leads.append(
            LeadOverGenerate(
                model=model,
                uniform=float(uniform[4]),
                mixed=float(mixed[4]),
                computed_per_useful=int(mixed[3]) / int(mixed[2]),
            )
        )
    return leads


def _against(ratio: float, margin: float, more: str, less: str, tie: str) -> str:
    """`more`, `less` or `tie` for a ratio above, below or within `margin` of 1."""
    return more if ratio > 1 + margin else less if ratio < 1 - margin else tie


def lead_lines(leads: Sequence[LeadOverGenerate], margin: float = 0.05) -> list[str]:
    """Per model, the lead on each workload and, on the mixed one, whether llmengine's steps
    were cheaper or dearer per position than generate's once the skipped work is divided out;
    within `margin` of 1 counts as a tie, since the benchmark's single runs are noisy."""
    lines = []
    for lead in leads:
        step = _against(lead.uniform, margin, "faster than", "slower than", "about as fast as")
        position = _against(
            lead.mixed_per_position, margin, "cheaper than", "dearer than", "about the same as"
        )
        lines.append(
            f"- {lead.model}: llmengine served the uniform burst {step} generate "
            f"({lead.uniform:.2f}x). On the mixed workload, its {lead.mixed:.2f}x is the "
            f"{lead.computed_per_useful:.2f} positions generate computes per useful token times "
            f"{lead.mixed_per_position:.2f}x per position computed: llmengine's positions were "
            f"{position} generate's."
        )
    return lines

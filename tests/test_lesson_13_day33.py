"""Lesson 13 (Day 33): the committed tables are the seed's numbers.

`make test` separately re-runs the lesson and fails if its tables would change, so together
these say: the lesson, run on the real engine, computes exactly what Day 33 reported.
"""

from __future__ import annotations

from pathlib import Path

REPORTS = Path(__file__).resolve().parent.parent / "reports"

# Day 33's table: (pool tokens, policy) -> (iterations, occupancy, preemptions, recomputed).
DAY33 = {
    (48, "reserve"): (96, "0.250", 0, 0),
    (48, "incremental"): (44, "0.545", 3, 55),
    (96, "reserve"): (48, "0.500", 0, 0),
    (96, "incremental"): (28, "0.857", 1, 25),
    (128, "reserve"): (24, "1.000", 0, 0),
    (128, "incremental"): (24, "1.000", 0, 0),
}


def read_table(name: str) -> list[dict[str, str]]:
    """Rows of a Markdown pipe table in reports/, as dicts keyed by header."""
    lines = (REPORTS / f"{name}.md").read_text().strip().splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    headers, rows = cells[0], cells[2:]
    return [dict(zip(headers, row, strict=True)) for row in rows]


def test_measured_pair_of_pools_matches_day33() -> None:
    rows = read_table("day33-incremental-allocation")
    measured = {
        (int(row["pool (tokens)"]), row["policy"].split("(")[1].rstrip(")")): (
            int(row["iterations"]),
            row["occupancy"],
            int(row["preemptions"]),
            int(row["recomputed"]),
        )
        for row in rows
    }
    assert measured == DAY33
    assert {row["tokens"] for row in rows} == {"96"}


def test_day29_shape_needs_31_blocks_reserved_and_16_incremental() -> None:
    rows = read_table("day33-day29-shape")
    smallest = {row["policy"]: int(row[list(row)[1]]) for row in rows}
    assert smallest == {"Week 8 (reserve)": 31, "Day 33 (incremental)": 16}

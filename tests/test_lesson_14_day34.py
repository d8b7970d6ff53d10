"""Lesson 14 (Day 34): the committed tables are the seed's numbers.

`make test` separately re-runs the lesson and fails if its tables would change, so together
these say: the lesson, run on the real engine, computes exactly what Day 34 reported.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

REPORTS = Path(__file__).resolve().parent.parent / "reports"
POOLS = [48, 32, 24, 16, 12, 8]

# Day 34's table: pool -> (occupancy, evictions per request, recompute share, victim latency).
DAY34 = {
    48: ("1.000", "0.00", "0.0%", "1.00"),
    32: ("0.750", "0.33", "21.7%", "1.25"),
    24: ("0.667", "0.50", "26.3%", "1.39"),
    16: ("0.462", "0.83", "32.1%", "1.71"),
    12: ("0.375", "1.17", "39.9%", "1.90"),
    8: ("0.240", "1.33", "37.5%", "2.83"),
}


def read_table(name: str) -> list[dict[str, str]]:
    """Rows of a Markdown pipe table in reports/, as dicts keyed by header."""
    lines = (REPORTS / f"{name}.md").read_text().strip().splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    headers, rows = cells[0], cells[2:]
    return [dict(zip(headers, row, strict=True)) for row in rows]


def by_pool(name: str) -> dict[int, dict[str, str]]:
    return {int(row["pool (blocks)"]): row for row in read_table(name)}


def test_the_bill_per_pool_matches_day34() -> None:
    rows = by_pool("day34-recompute-bill")
    assert list(rows) == POOLS
    measured = {
        pool: (
            row["occupancy"],
            row["evictions per request"],
            row["recompute share"],
            row["victim latency (x)"],
        )
        for pool, row in rows.items()
    }
    assert measured == DAY34
    assert {row["tokens"] for row in rows.values()} == {"144"}


def test_rows_cannot_tell_48_blocks_from_12_and_positions_can() -> None:
    rows = by_pool("day34-rows-and-positions")
    for pool in (48, 12):
        assert (rows[pool]["rows issued"], rows[pool]["tokens"]) == ("144", "144")
        assert float(rows[pool]["waste fraction"]) == 0.0
    assert (rows[48]["forward positions"], rows[12]["forward positions"]) == ("168", "268")
    assert rows[12]["recomputed"] == "107"
    assert {row["rows issued"] for row in rows.values()} == {"144"}


def test_tight_pools_catch_victims_young() -> None:
    rows = by_pool("day34-rows-and-positions")
    per_eviction = {pool: row["recomputed per eviction"] for pool, row in rows.items()}
    assert (per_eviction[8], per_eviction[12], per_eviction[48]) == ("12.0", "15.3", "n/a")


def test_one_decode_row_against_one_resumed_row() -> None:
    rows = read_table("day34-one-iteration")
    assert len({row["iteration"] for row in rows}) == 1
    counted = sorted((row["row"], row["rows"], row["positions"], row["recomputed"]) for row in rows)
    assert counted == [("decode", "1", "1", "0"), ("resumed prefill", "1", "13", "13")]


def test_the_12_block_staircase() -> None:
    rows = read_table("day34-staircase")
    latencies = [int(row["latency, 12 blocks"]) for row in rows]
    assert latencies == [24, 28, 36, 44, 56, 64]
    assert fmean(latencies) == 42  # the mean that describes nobody
    assert latencies.count(42) == 0
    assert (rows[0]["evictions"], rows[-1]["evictions"]) == ("0", "3")
    # The uncontaminated comparison: the youngest request in the roomy pool.
    assert (rows[-1]["latency, 48 blocks"], rows[-1]["latency, 12 blocks"]) == ("24", "64")


def test_the_in_run_control_group_can_err_either_way() -> None:
    rows = read_table("day34-control-group")
    in_run, clean = "victims vs the others in the run (x)", "victims vs themselves at 48 blocks (x)"
    ratios = {(row["requests"], row["pool (blocks)"]): (row[in_run], row[clean]) for row in rows}
    assert ratios[("6", "12")] == ("1.90", "1.90")
    low, high = ratios[("12", "16")], ratios[("12", "12")]
    assert float(low[0]) < float(low[1]) and float(high[0]) > float(high[1])

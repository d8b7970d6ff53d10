"""The tables lessons 12, 13 and 14 committed, against the seeds' numbers in `seed_tables`.

`make test` re-runs every lesson and fails when a table it writes differs from the committed
one; these tests tie the committed tables to the seeds. Together: the lessons, run on the
real engine, compute what Day 33 and Day 34 published. The engine and the scheduler are
checked against the same numbers in test_batchbench_engine.py and test_scheduler.py.
"""

from __future__ import annotations

import re
from statistics import fmean

import seed_tables as seeds
from report_tables import read_report_table


def policy_of(label: str) -> str:
    """`reserve` or `incremental`, however the lesson labels the policy."""
    found = re.search(r"\b(reserve|incremental)\b", label)
    assert found, f"no policy named in {label!r}"
    return found.group(1)


def by_pool(name: str) -> dict[int, dict[str, str]]:
    return {int(row["pool (blocks)"]): row for row in read_report_table(name)}


def test_lesson_13_pair_of_pools_is_day33s_table() -> None:
    rows = read_report_table("incremental-against-reserve")
    measured = {
        (int(row["pool (tokens)"]), policy_of(row["policy"])): seeds.Day33Row(
            int(row["iterations"]),
            float(row["occupancy"]),
            int(row["preemptions"]),
            int(row["recomputed"]),
        )
        for row in rows
    }
    assert measured == seeds.DAY33
    assert {int(row["tokens"]) for row in rows} == {seeds.DAY33_TOKENS}


def test_lesson_12_day29_shape_pools() -> None:
    rows = read_report_table("reservation-smallest-pools")
    smallest = {policy_of(row["policy"]): int(list(row.values())[1]) for row in rows}
    assert smallest == seeds.DAY29_SHAPE_SMALLEST_POOL


def test_lesson_14_bill_per_pool_is_day34s_table() -> None:
    rows = by_pool("recompute-bill")
    assert list(rows) == seeds.DAY34_POOLS
    measured = {
        pool: seeds.Day34Row(
            float(row["occupancy"]),
            float(row["evictions per request"]),
            float(row["recompute share"].rstrip("%")),
            float(row["victim latency (x)"]),
        )
        for pool, row in rows.items()
    }
    assert measured == seeds.DAY34
    assert {int(row["tokens"]) for row in rows.values()} == {seeds.DAY34_TOKENS}


def test_lesson_14_rows_cannot_tell_the_pools_apart_and_positions_can() -> None:
    rows = by_pool("recompute-rows-and-positions")
    assert {int(row["rows issued"]) for row in rows.values()} == {seeds.DAY34_TOKENS}
    assert {float(row["waste fraction"]) for row in rows.values()} == {0.0}
    positions = {pool: int(rows[pool]["forward positions"]) for pool in (48, 12)}
    assert positions == seeds.DAY34_FORWARD_POSITIONS
    assert int(rows[12]["recomputed"]) == seeds.DAY34_RECOMPUTED_AT_12
    per_eviction = {pool: float(rows[pool]["recomputed per eviction"]) for pool in (8, 12)}
    assert per_eviction == seeds.DAY34_PER_EVICTION
    assert rows[48]["recomputed per eviction"] == "n/a"


def test_lesson_14_staircase_at_12_blocks() -> None:
    rows = read_report_table("recompute-staircase")
    latencies = [int(row["latency, 12 blocks"]) for row in rows]
    assert latencies == seeds.DAY34_STAIRCASE_AT_12
    assert fmean(latencies) == seeds.DAY34_MEAN_LATENCY_AT_12
    assert seeds.DAY34_MEAN_LATENCY_AT_12 not in latencies  # the mean describes nobody
    assert (rows[0]["evictions"], rows[-1]["evictions"]) == (
        "0",
        str(seeds.DAY34_YOUNGEST_EVICTIONS_AT_12),
    )
    assert int(rows[-1]["latency, 48 blocks"]) == seeds.DAY34_YOUNGEST_LATENCY_AT_48


def test_lesson_14_one_decode_row_against_one_resumed_row() -> None:
    rows = read_report_table("recompute-one-iteration")
    assert len({row["iteration"] for row in rows}) == 1
    counted = sorted((row["row"], row["rows"], row["positions"], row["recomputed"]) for row in rows)
    assert counted == [("decode", "1", "1", "0"), ("resumed prefill", "1", "13", "13")]


def test_lesson_14_in_run_control_group_can_err_either_way() -> None:
    rows = read_report_table("recompute-control-group")
    in_run, clean = "victims vs the others in the run (x)", "victims vs themselves at 48 blocks (x)"
    ratios = {
        (int(row["requests"]), int(row["pool (blocks)"])): (float(row[in_run]), float(row[clean]))
        for row in rows
    }
    seed_ratio = seeds.DAY34[12].victim_latency
    assert ratios[(seeds.DAY34_REQUESTS, 12)] == (seed_ratio, seed_ratio)
    low, high = ratios[(12, 16)], ratios[(12, 12)]
    assert low[0] < low[1] and high[0] > high[1]

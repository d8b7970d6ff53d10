"""Lesson 20's sentences about its wall-clock runs: each states the numbers it is given and
picks its comparison words from them, so that no run can print a sentence its table denies."""

from __future__ import annotations

import pytest

from llmengine.bench.http_client import HttpRun, RequestRecord
from llmengine.lessons.serving_readings import (
    slots_reading,
    stream_reading,
    sweep_reading,
    waves,
    waves_reading,
)


def summary(rate: float | None, tokens: float, ttft: float, tpot: float, itl: float = 5.0):
    """A run summary with only the fields the readings use; latencies in ms."""
    return {
        "request_rate": rate,
        "request_throughput": tokens / 48,
        "output_token_throughput": tokens,
        "ttft_ms": {"p50": ttft},
        "tpot_ms": {"p50": tpot},
        "itl_ms": {"p50": itl},
    }


def test_stream_reading_says_whether_the_first_chunk_waited_longest() -> None:
    slow_first = stream_reading([0.011, 0.016, 0.021, 0.028])
    assert "arrives 11.0 ms" in slow_first and "longer than any gap after it" in slow_first
    assert "median of 5.0 ms" in slow_first
    slow_later = stream_reading([0.004, 0.009, 0.021, 0.026])
    assert "longer than any gap" not in slow_later
    assert "one later gap, 12.0 ms, is longer still" in slow_later
    with pytest.raises(ValueError):
        stream_reading([0.01])


def test_waves_split_where_first_tokens_are_far_apart() -> None:
    assert waves([0.53, 0.1, 0.5, 0.11, 1.0, 0.52], gap=0.1) == [2, 3, 1]
    assert waves([0.1, 0.15, 0.2], gap=0.1) == [3]
    assert waves([], gap=0.1) == []


def test_waves_reading_counts_each_runs_waves_in_its_own_steps() -> None:
    def run(ttfts: list[float]) -> HttpRun:  # each request generates for 0.3 s
        records = [RequestRecord(1, ttft=t, e2e=t + 0.3) for t in ttfts]
        return HttpRun(records, duration=2.0)

    reading = waves_reading({4: run([0.02, 0.03, 0.5, 0.51]), 16: run([0.02, 0.05, 0.1, 0.16])})
    assert "2 waves with 4 slots (of 2, 2 requests)" in reading
    assert "1 wave with 16 slots (of 4 requests)" in reading


def test_slots_reading_compares_the_step_with_the_rows() -> None:
    few, many = summary(None, 500, 996, 7, itl=7.6), summary(None, 900, 125, 12, itl=12.4)
    cheap = slots_reading(few, many, (4, 16))
    assert "996 ms with 4 slots and 125 ms with 16" in cheap
    assert "12.4 ms with 16 slots against 7.6 ms with 4: less than 4 times as long" in cheap
    assert "1.80 times the tokens per second" in cheap
    dear = slots_reading(few, summary(None, 400, 125, 40, itl=40.0), (4, 16))
    assert "at least 4 times as long, for 4 times as many rows" in dear
    bunched = slots_reading(few, summary(None, 900, 125, 12, itl=0.01), (4, 16))
    assert "bunched, so this run does not time the steps" in bunched
    assert "times as long" not in bunched
    quicker = slots_reading(few, summary(None, 900, 125, 6, itl=6.1), (4, 16))
    assert "6.1 ms with 16 slots against 7.6 ms with 4: shorter, though it carries 4" in quicker


def test_sweep_reading_follows_a_sweep_that_reaches_its_knee() -> None:
    curve = [
        summary(4, 147, 20, 6.5),
        summary(8, 286, 17, 6.0),
        summary(16, 514, 20, 7.1),
        summary(32, 641, 192, 8.4),
        summary(None, 620, 586, 10.2),
    ]
    reading = sweep_reading(curve)
    assert "147 → 286 → 514 → 641 (620 all at once)" in reading
    assert "+95%, +80%, +25%: each step up buys less than the one before" in reading
    assert "it rises by 29%" in reading
    assert "loses throughput" not in reading
    assert "first more than doubles between 16 and 32 requests per second" in reading
    assert "and it falls from 4 to 8 requests per second" in reading


def test_sweep_reading_follows_a_sweep_below_its_knee() -> None:
    curve = [summary(4, 544, 20, 6.7), summary(8, 774, 22, 6.0), summary(16, 1007, 25, 5.5)]
    reading = sweep_reading(curve)
    assert "all at once" not in reading
    assert "+42%, +30%: each step up buys less" in reading
    assert "it falls by 18%" in reading
    assert "it never doubles from one offered rate to the next" in reading
    rising = sweep_reading(
        [summary(4, 100, 20, 6), summary(8, 150, 20, 6), summary(16, 300, 20, 6)]
    )
    assert "+50%, +100%: the gains do not shrink steadily." in rising
    falling = sweep_reading(
        [summary(4, 148, 17, 5.8), summary(8, 284, 20, 6.8), summary(16, 160, 226, 15.9)]
    )
    busy_spell = sweep_reading(
        [summary(8, 148, 60, 5.8), summary(16, 284, 1689, 6.8), summary(32, 400, 258, 7.0)]
    )
    assert "between 8 and 16 requests per second, and it falls from 16 to 32" in busy_spell
    assert (
        "+92%, -44%: each step up buys less than the one before; offering 16 requests per "
        "second instead of 8 loses throughput" in falling
    )

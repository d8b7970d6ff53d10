"""Lesson 22's wall-clock tables and sentences, on summaries made up so that every median,
range, ratio and word can be worked out by hand."""

from __future__ import annotations

import pytest

from llmengine.bench.batchbench import WorkloadRun
from llmengine.lessons.chunked_prefill import StallSummary
from llmengine.lessons.chunked_prefill_tables import (
    STALL_FORMATS,
    STALL_HEADERS,
    chunking_cost_sentence,
    medians,
    ratio,
    stall_rows,
    step_durations,
)


def summary(gap: float, ttft: float, tokens_per_s: float) -> StallSummary:
    return StallSummary(gap, gap, gap / 4, ttft, tokens_per_s)


def test_medians_keep_the_middle_run_and_the_range_of_each_field() -> None:
    runs = [summary(0.05, 0.3, 500), summary(0.01, 0.1, 400), summary(0.02, 0.2, 450)]
    m = medians(runs)
    assert m["worst_gap_s"] == (0.02, 0.01, 0.05)
    assert m["long_ttft_s"] == (0.2, 0.1, 0.3)
    assert m["tokens_per_s"] == (450, 400, 500)


def test_stall_rows_follow_the_headers_in_milliseconds() -> None:
    results = {None: medians([summary(0.06, 0.06, 560)]), 64: medians([summary(0.015, 0.1, 540)])}
    rows = stall_rows(results)
    assert len(STALL_HEADERS) == len(STALL_FORMATS) == len(rows[0])
    assert rows[0][0] == "none" and rows[1][0] == "64"
    assert rows[1][1] == pytest.approx(15.0) and rows[1][4] == pytest.approx(100.0)
    assert rows[1][5] == "100-100" and rows[1][7] == "540-540"
    assert ratio(results, 64, "long_ttft_s") == pytest.approx(0.1 / 0.06)


def test_step_durations_are_the_differences_of_the_clock() -> None:
    run = WorkloadRun([], [0.5, 1.25, 3.0], {}, [], [])
    assert step_durations(run) == pytest.approx([0.5, 0.75, 1.75])


def test_the_chunking_sentence_reads_its_words_from_the_numbers() -> None:
    chunks = {None: 1, 32: 12, 128: 3}
    growing = {None: 0.060, 32: 0.115, 128: 0.070}
    sentence = chunking_cost_sentence(growing, chunks, decode_step_s=0.005)
    assert "one prefill took 60.0 ms" in sentence
    # (115 - 60) / 11 = 5 ms an extra chunk: one decode-only step of 5 ms
    assert (
        "12 chunks took 1.92x that: +5.0 ms for each chunk after the first, 1.0 times" in sentence
    )
    assert "3 chunks took 1.17x that: +5.0 ms" in sentence
    assert "The TTFT grew with every step up" in sentence
    flat = {None: 0.060, 32: 0.115, 128: 0.058}
    assert "did not grow" in chunking_cost_sentence(flat, chunks, decode_step_s=0.005)

"""Lesson 25's helpers: one stream's ceiling measured beside llama.cpp (`bench.one_row`), its
report written and read back, and llama.cpp's generation-only speed parsed."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

import llmengine
from llmengine.bench.peers import llamacpp
from llmengine.lessons import one_row
from llmengine.lessons.exercises.lesson_25 import one_row_ceiling

RUN = one_row.OneRowRun(
    threads=2,
    weight_bytes=13_697_024,
    cache_bandwidth=40e9,
    dram_bandwidth=10e9,
    llamacpp_tokens_per_s=2500.0,
    llmengine_step_s=0.004,
    llmengine_products_s=0.001,
    operators_per_step=300,
    engine_stream_tokens_per_s=900.0,
)


def test_the_bounds_are_a_bandwidth_over_the_weights_bytes() -> None:
    assert RUN.bound(RUN.dram_bandwidth) == pytest.approx(10e9 / 13_697_024)
    assert RUN.bound(RUN.cache_bandwidth) == pytest.approx(4 * RUN.bound(RUN.dram_bandwidth))
    assert RUN.llamacpp_step_s == pytest.approx(0.0004)
    assert RUN.llmengine_outside_products_s == pytest.approx(0.003)


@pytest.mark.parametrize("llamacpp_speed", [2500.0, math.nan])
def test_the_report_reads_back_what_it_wrote(tmp_path: Path, llamacpp_speed: float) -> None:
    run = replace(RUN, llamacpp_tokens_per_s=llamacpp_speed)
    path = tmp_path / "one-row-ceiling.md"
    path.write_text(one_row.report(run, "Measured on: a test machine"), encoding="utf-8")
    machine, back = one_row.read_report(path)
    assert machine == "Measured on: a test machine"
    assert back.threads == 2 and isinstance(back.threads, int)
    assert back.operators_per_step == 300 and back.weight_bytes == 13_697_024
    assert back.cache_bandwidth == pytest.approx(40e9, rel=1e-6)
    assert back.llmengine_step_s == pytest.approx(0.004, rel=1e-6)
    assert back.engine_stream_tokens_per_s == pytest.approx(900.0)
    if math.isnan(llamacpp_speed):
        assert math.isnan(back.llamacpp_tokens_per_s)
    else:
        assert back.llamacpp_tokens_per_s == pytest.approx(2500.0)


def test_measure_keeps_the_best_of_its_rounds() -> None:
    model = llmengine.load_model(kernels="eager")
    speeds = iter([100.0, 300.0, 200.0])
    streams = iter([50.0, 40.0, 70.0])
    run = one_row.measure(
        model,
        4 * 2**20,
        lambda: next(speeds),
        threads=1,
        rounds=3,
        dram_working_set=32 * 2**20,
        stream=lambda: next(streams),
    )
    assert run.llamacpp_tokens_per_s == 300.0  # the fastest round
    assert run.engine_stream_tokens_per_s == 70.0
    assert run.cache_bandwidth > 0 and run.dram_bandwidth > 0
    assert 0 < run.llmengine_products_s < run.llmengine_step_s
    assert run.operators_per_step > 50  # a step is far more than its products
    skipped = one_row.measure(model, 4 * 2**20, None, 1, rounds=1, dram_working_set=2**25)
    assert math.isnan(skipped.llamacpp_tokens_per_s)
    assert math.isnan(skipped.engine_stream_tokens_per_s)


def test_an_engine_stream_times_the_generation_of_one_request() -> None:
    model = llmengine.load_model(kernels="eager")
    stream = one_row.engine_stream(model, decode_graph=())
    first, second = stream(), stream()  # the engine is idle again after each call
    assert first > 0 and second > 0


def test_generation_speed_counts_the_generation_time_alone() -> None:
    line = {"pp": 32, "tg": 64, "pl": 1, "t_pp": 0.1, "t_tg": 0.4, "t": 0.5}
    text = "main: n_kv_max = 96\n" + json.dumps(line)
    assert llamacpp.parse_batched_bench(text, "t_tg") == {1: pytest.approx(64 / 0.4)}
    assert llamacpp.parse_batched_bench(text) == {1: pytest.approx(64 / 0.5)}


def test_the_ceiling_follows_the_working_set() -> None:
    # The 25M model: ~24 MB in int8 fits a 32 MB cache; ~97 MB in float32 does not.
    assert one_row_ceiling("int8", 32, 60, 20) == pytest.approx(
        3 * one_row_ceiling("int8", 16, 60, 20)
    )
    assert one_row_ceiling("float32", 32, 60, 20) == pytest.approx(
        one_row_ceiling("float32", 16, 60, 20)
    )


def test_the_last_level_cache_is_named() -> None:
    assert isinstance(one_row.last_level_cache(), str) and one_row.last_level_cache()

"""Lesson 24's helpers: the roofline's two ceilings, a step's bytes and FLOPs, the figure."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from llmengine.bench.decode_step import HELD_OUT_CONFIG, SHAPE_100M_CONFIG, random_llama
from llmengine.lessons.roofline import (
    BYTES_PER_WEIGHT,
    Ceilings,
    bytes_and_flops_rows,
    matrix_product_rate,
    memory_read_bandwidth,
    plot_roofline,
    product_intensity,
    read_bandwidth,
)
from llmengine.lessons.step_cost import weights_multiplied
from llmengine.speed.prepare import prepare_for_speed, products


def test_the_roofline_is_the_lower_of_the_two_ceilings():
    ceilings = Ceilings(bandwidth=20e9, flop_rate=100e9)
    assert ceilings.ridge == 5.0
    assert ceilings.attainable(0.5) == 10e9  # memory-bound: bandwidth x intensity
    assert ceilings.attainable(5.0) == 100e9
    assert ceilings.attainable(64.0) == 100e9  # compute-bound: the flat roof


def test_intensity_is_two_flops_per_weight_per_row_over_its_bytes():
    assert product_intensity(1, 4) == 0.5
    assert product_intensity(32, 4) == 16.0
    assert product_intensity(8, 1) == 16.0


def test_bytes_and_flops_count_every_weight_of_a_step():
    model = random_llama(HELD_OUT_CONFIG)
    prepared = prepare_for_speed(model, "eager")  # fused: each product has one weight to count
    weights = sum(product.weight.numel() for product in products(prepared))
    assert weights == weights_multiplied(HELD_OUT_CONFIG)
    rows = bytes_and_flops_rows({"25M": HELD_OUT_CONFIG, "100M": SHAPE_100M_CONFIG}, (1, 32))
    assert [row[:2] for row in rows] == [["25M", 1], ["25M", 32], ["100M", 1], ["100M", 32]]
    name, count, f32, bf16, int8, flops, intensity = rows[1]
    assert (f32, bf16, int8) == tuple(weights * b for b in BYTES_PER_WEIGHT.values())
    assert flops == 2 * 32 * weights and intensity == 16.0


def test_the_ceilings_are_measured_as_positive_rates():
    torch.set_num_threads(1)
    assert memory_read_bandwidth(megabytes=8, repeats=2) > 1e8
    assert matrix_product_rate(size=128, repeats=2) > 1e7
    assert read_bandwidth(2**20, repeats=2) > 1e8  # a working set of 1 MiB, any size is taken


@pytest.mark.parametrize("versions", [1, 2])
def test_the_figure_places_one_line_per_version_under_the_roof(versions):
    measured = {f"v{v}": {1: 1e9 * v, 8: 4e9 * v} for v in range(versions)}
    fig = plot_roofline(Ceilings(20e9, 100e9), measured, dict.fromkeys(measured, 4), "a roofline")
    assert isinstance(fig, Figure)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 1 + versions  # the roof, then each version
    assert fig.axes[0].get_title() == "a roofline"

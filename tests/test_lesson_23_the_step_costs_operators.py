"""Lesson 23, the step costs operators: its deterministic tables recomputed, and its helpers.

The operator counts and FLOP counts of the committed tables are recomputed from the same
models (the embedded one and the random 25M shape, each before and after fusing and packing);
the products a layer runs are checked against what the code implies, and the FLOP formula
against a count by hand on a tiny config. The timing helpers are run small, for what they
return rather than for how fast anything is.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from report_tables import read_report_table

import llmengine
from llmengine.bench.decode_step import HELD_OUT_CONFIG, random_llama
from llmengine.bench.throughput import decode_weights, matrix_product_seconds, operator_counts
from llmengine.lessons.step_cost import (
    ATTENTION,
    ELEMENTWISE,
    LAYOUT,
    MATRIX_PRODUCTS,
    OPERATOR_KINDS,
    OTHER,
    count_changes,
    decode_cost,
    decode_step_flops,
    decode_step_operators,
    fastest_decode_costs,
    markdown_column,
    markdown_sections,
    matrix_products_of,
    mixed_step_seconds,
    operator_kind,
    operators_by_kind,
    packing_timings,
    unprepared_twin,
    weights_multiplied,
)
from llmengine.model.config import LlamaConfig
from llmengine.speed.prepare import PreparedLlama, prepare_for_speed, products

# Small enough to count by hand: head_dim 4, one K/V head for two query heads.
TINY = {
    "model_type": "llama",
    "vocab_size": 10,
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}
ROWS, CONTEXT = 32, 64
BENCH_REPORT = Path(__file__).resolve().parent.parent / "reports/wallclock"


def tiny_config(tied: bool = False) -> LlamaConfig:
    return LlamaConfig.from_dict({**TINY, "tie_word_embeddings": tied}, source="tiny")


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The embedded model as the lesson loads it: packed by the fixed rule, not measured, so
    that its operator counts are the same on every machine."""
    return llmengine.load_model(kernels="packed")


@pytest.fixture(scope="module")
def models(model: llmengine.Llama) -> dict[str, dict[str, llmengine.Llama]]:
    """The lesson's four models, built as the lesson builds them."""
    random_25m = random_llama(HELD_OUT_CONFIG)
    packed_25m = prepare_for_speed(unprepared_twin(random_25m), "packed")
    return {
        "embedded": {"before": unprepared_twin(model), "after": model},
        "random 25M": {"before": random_25m, "after": packed_25m},
    }


@pytest.fixture(scope="module")
def counts(models) -> dict[tuple[str, str], Counter[str]]:
    return {
        (name, version): decode_step_operators(m, ROWS, CONTEXT)
        for name, pair in models.items()
        for version, m in pair.items()
    }


# -- operators per decode step -------------------------------------------------------------


def test_the_operators_by_kind_table_is_the_decode_step_counted(counts) -> None:
    rows = read_report_table("step-cost-operators-by-kind")
    assert [(row["model"], row["version"]) for row in rows] == list(counts)
    for row in rows:
        kinds = operators_by_kind(counts[row["model"], row["version"]])
        assert {kind: int(row[kind]) for kind in OPERATOR_KINDS} == kinds
        assert int(row["all operators"]) == sum(counts[row["model"], row["version"]].values())


def test_a_layer_runs_seven_products_before_and_four_after(models, counts) -> None:
    for name, pair in models.items():
        layers = pair["after"].config.num_hidden_layers
        expected = {"before": 7 * layers + 1, "after": 4 * layers + 1}  # + the output head
        for version, m in pair.items():
            assert matrix_products_of(m) == expected[version]
            assert operators_by_kind(counts[name, version])[MATRIX_PRODUCTS] == expected[version]
        assert counts[name, "before"]["aten.linear.default"] == expected["before"]
        assert counts[name, "after"]["mkl._mkl_linear.default"] == expected["after"]


def test_the_operator_changes_table_is_before_against_after(counts) -> None:
    rows = read_report_table("step-cost-operator-changes")
    changes = count_changes(counts["embedded", "before"], counts["embedded", "after"])
    assert [(r["operator"], int(r["before"]), int(r["after"])) for r in rows] == changes
    assert all(int(r["change"]) == int(r["after"]) - int(r["before"]) for r in rows)


def test_count_changes_lists_only_what_changed_largest_first() -> None:
    before = Counter({"a": 3, "b": 1, "c": 5})
    after = Counter({"a": 3, "b": 4, "c": 4, "d": 1})
    assert count_changes(before, after) == [("b", 1, 4), ("c", 5, 4), ("d", 0, 1)]


def test_operators_are_sorted_into_kinds_by_name() -> None:
    assert operator_kind("aten.linear.default") == MATRIX_PRODUCTS
    assert operator_kind("mkl._mkl_linear.default") == MATRIX_PRODUCTS
    assert operator_kind("aten.scaled_dot_product_attention.default") == ATTENTION
    assert operator_kind("aten.mul.Tensor") == ELEMENTWISE
    assert operator_kind("aten.to.dtype") == ELEMENTWISE
    assert operator_kind("aten.split_with_sizes.default") == LAYOUT
    assert operator_kind("aten.index_select.default") == LAYOUT
    assert operator_kind("aten.mean.dim") == OTHER
    assert operator_kind("aten.item.default") == OTHER
    totals = operators_by_kind(Counter({"aten.mul.Tensor": 2, "aten.view.default": 3}))
    assert list(totals) == list(OPERATOR_KINDS)
    assert totals == {MATRIX_PRODUCTS: 0, ATTENTION: 0, ELEMENTWISE: 2, LAYOUT: 3, OTHER: 0}


def test_the_unprepared_twin_computes_what_the_prepared_model_computes(model) -> None:
    twin = unprepared_twin(model)
    assert not isinstance(twin, PreparedLlama)
    assert all(product.is_packed for product in products(model))
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(twin(ids), model(ids), rtol=1e-4, atol=1e-4)


# -- FLOPs ---------------------------------------------------------------------------------


def test_decode_step_flops_match_a_count_by_hand() -> None:
    config = tiny_config()
    # Per layer: q 8x8, k 8x4, v 8x4, o 8x8 = 192; gate, up, down 3 x 8x12 = 288. Two layers,
    # and the output head 8x10.
    assert weights_multiplied(config) == 2 * (192 + 288) + 80 == 1040
    rows, keys = 3, 5
    products = 2 * rows * 1040
    attention = 2 * 2 * (4 * rows * keys * 4)  # layers x heads x (4 x rows x keys x head_dim)
    assert decode_step_flops(config, rows, keys) == products + attention == 7200


@pytest.mark.parametrize("tied", [False, True])
def test_the_weights_multiplied_are_the_weights_a_decode_step_reads(tied: bool) -> None:
    model = random_llama(tiny_config(tied))
    assert weights_multiplied(model.config) == sum(w.numel() for w in decode_weights(model))


def test_the_flops_table_is_the_formula_on_each_model(models) -> None:
    rows = read_report_table("step-cost-flops")
    assert len(rows) == 12
    for row in rows:
        config = models[row["model"]]["after"].config
        n = int(row["rows"])
        total = decode_step_flops(config, n, CONTEXT + 1)
        products = 2 * n * weights_multiplied(config)
        assert int(row["step FLOPs"].replace(",", "")) == total
        assert int(row["product FLOPs"].replace(",", "")) == products
        assert int(row["attention FLOPs"].replace(",", "")) == total - products


# -- timing helpers ------------------------------------------------------------------------


def test_matrix_products_alone_run_the_products_the_model_runs() -> None:
    before = random_llama(tiny_config())
    after = prepare_for_speed(unprepared_twin(before), "packed")
    for m, operator in ((before, "aten.linear.default"), (after, "mkl._mkl_linear.default")):
        counted = operator_counts(lambda m=m: matrix_product_seconds(m, 8, repeats=2))
        # one warm-up and two timed passes, each running every product once
        assert counted[operator] == 3 * matrix_products_of(m)
        assert operators_by_kind(counted)[MATRIX_PRODUCTS] == 3 * matrix_products_of(m)


def test_decode_cost_times_a_step_and_counts_its_flops() -> None:
    model = random_llama(tiny_config())
    cost = decode_cost(model, rows=4, context=8, repeats=2)
    assert cost.step_flops == decode_step_flops(model.config, 4, 9)
    assert cost.product_flops == 2 * 4 * weights_multiplied(model.config)
    assert cost.step_s > 0 and cost.products_s > 0
    assert cost.products_share == pytest.approx(cost.products_s / cost.step_s)
    assert cost.step_flop_rate == pytest.approx(cost.step_flops / cost.step_s)
    assert cost.products_flop_rate == pytest.approx(cost.product_flops / cost.products_s)


def test_fastest_decode_costs_cover_every_model_and_row_count() -> None:
    before = random_llama(tiny_config())
    models = {"before": before, "after": prepare_for_speed(unprepared_twin(before), "packed")}
    costs = fastest_decode_costs(models, (1, 3), context=4, repeats=1, rounds=2)
    assert list(costs) == ["before", "after"]
    for key, by_rows in costs.items():
        assert list(by_rows) == [1, 3]
        for rows, cost in by_rows.items():
            assert cost.rows == rows
            assert cost.step_flops == decode_step_flops(models[key].config, rows, 5)
            assert cost.step_s > 0 and cost.products_s > 0


def test_packing_timings_compare_the_two_products_per_row_count() -> None:
    weight = torch.randn(48, 32)
    timings = packing_timings(weight, (1, 3), repeats=2)
    assert [t.rows for t in timings] == [1, 3]
    for t in timings:
        assert t.eager_s > 0 and t.packed_s > 0
        assert t.speedup == pytest.approx(t.eager_s / t.packed_s)


def test_a_mixed_step_is_timed_with_its_parts() -> None:
    model = random_llama(tiny_config())
    timing = mixed_step_seconds(model, prefill=24, decodes=3, context=10, repeats=2)
    assert min(timing.mixed_s, timing.prefill_s, timing.decodes_s) > 0
    assert timing.against_parts == pytest.approx(
        timing.mixed_s / (timing.prefill_s + timing.decodes_s)
    )


# -- the benchmark's report ----------------------------------------------------------------


def test_markdown_sections_picks_sections_by_heading(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("# Title\n\nintro\n\n## Alpha one\n\na\n\n## Beta\n\nb\n\n## Gamma\n\nc\n")
    assert markdown_sections(report, ["Gamma", "Alpha"]) == "## Alpha one\n\na\n\n## Gamma\n\nc\n"
    with pytest.raises(ValueError, match="Delta"):
        markdown_sections(report, ["Delta"])


def test_the_throughput_report_has_the_section_the_lesson_shows() -> None:
    shown = markdown_sections(
        BENCH_REPORT / "throughput-vs-transformers.md", ["Useful tokens per second"]
    )
    assert shown.startswith("## Useful tokens per second")
    assert "\n## " not in shown  # one section, up to the next heading


def test_markdown_column_reads_one_column_of_every_table() -> None:
    first = "| x | y |\n|---:|---:|\n| 1 | 2 |\n| 3 | 4 |\n"
    text = f"## A\n\n{first}\nprose\n\n| y | x |\n|--|--|\n| 5 | 6 |\n"
    assert markdown_column(text, "x") == ["1", "3", "6"]
    assert markdown_column(text, "y") == ["2", "4", "5"]
    with pytest.raises(ValueError, match="'z'"):
        markdown_column(text, "z")

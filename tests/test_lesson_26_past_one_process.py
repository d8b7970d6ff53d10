"""Lesson 26: the committed notebook and reports say what the lesson claims (every prompt's
tokens equal at two ranks, rank 0's weights half the whole along the cut dimension), and its
helpers count and model what the lesson says they do."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from report_tables import report_rows

import llmengine
from llmengine.lessons.tensor_parallel import (
    LLAMA3_8B,
    all_reduces_per_decode_step,
    parameter_bytes,
    plot_split,
    rank_parameters,
    rank_weights_read,
    ring_all_reduce_seconds,
    shape_rows,
    slices_make_the_whole,
)
from llmengine.model.config import LlamaConfig
from llmengine.model.sharding import Shard, split_dim

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "lessons" / "26-past-one-process.ipynb"
CONFIG = LlamaConfig.from_file(llmengine.embedded_model_path() / "config.json")


def test_every_prompt_gives_the_same_tokens_at_two_ranks() -> None:
    rows = report_rows("tensor-parallel-same-text")
    assert len(rows) >= 3
    assert [row[1] for row in rows] == ["yes"] * len(rows)
    assert all(row[2] for row in rows)  # a text was generated


def test_rank_zero_holds_half_of_each_cut_dimension() -> None:
    rows = report_rows("tensor-parallel-shapes")
    assert [row[0] for row in rows] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    for name, whole, mine, cut, _ in rows:
        whole, mine = ast.literal_eval(whole), ast.literal_eval(mine)
        dim = 1 if cut.startswith("columns") else 0
        assert dim == (1 if name in ("o_proj", "down_proj") else 0)
        assert mine[dim] * 2 == whole[dim] and mine[1 - dim] == whole[1 - dim]


def test_the_memory_report_matches_the_count_of_this_split() -> None:
    rows = report_rows("tensor-parallel-memory")
    held = {int(row[0]): int(row[1].replace(",", "")) for row in rows}
    assert held == {world: 4 * rank_parameters(CONFIG, world) for world in held}
    assert held[1] > held[2] > held[4] > held[1] // 4  # the embedding is whole on every rank


def test_the_parts_kept_whole_are_twice_the_two_rank_share_less_one() -> None:
    """The lesson reads the share of the parameters every rank keeps whole off the memory
    table (k = 2 x the two-rank share - 1); counted tensor by tensor, it is the same."""
    rows = report_rows("tensor-parallel-memory")
    held = {int(row[0]): int(row[1].replace(",", "")) for row in rows}
    whole = llmengine.load_model(kernels="eager")
    kept = sum(
        parameter.numel() * parameter.element_size()
        for name, parameter in whole.named_parameters()
        if split_dim(f"model.{name}") is None
    )
    assert 0 < kept < held[1]
    assert kept / held[1] == pytest.approx(2 * held[2] / held[1] - 1)


def test_the_notebook_ran_and_ends_with_its_exercises() -> None:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert all(cell.get("execution_count") or not cell["source"] for cell in code)
    errors = [o for c in code for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    assert "lesson_26" in "".join(code[-1]["source"])
    assert (ROOT / "figures" / "tensor-parallel-split.png").is_file()


def test_the_slices_make_the_whole_and_the_table_checks_each_projection() -> None:
    check = slices_make_the_whole(llmengine.embedded_model_path(), world=2)
    assert check.equal == check.tensors == check.split + check.whole_on_every_rank
    assert check.split == 7 * CONFIG.num_hidden_layers
    whole = llmengine.load_model(kernels="eager")
    part = llmengine.load_model(kernels="eager", shard=Shard(0, 4))
    assert [row[-1] for row in shape_rows(whole, part, 4)] == ["yes"] * 7
    assert [row[-1] for row in shape_rows(whole, whole, 2)] == ["no"] * 7
    assert parameter_bytes(part) == 4 * rank_parameters(CONFIG, 4)


def test_the_cost_model_counts_and_divides() -> None:
    assert all_reduces_per_decode_step(CONFIG) == 8
    assert ring_all_reduce_seconds(1e6, 1, 1e9) == 0.0
    assert ring_all_reduce_seconds(1e6, 2, 1e9) == pytest.approx(1e-3)  # the payload once
    assert ring_all_reduce_seconds(1e6, 4, 1e9, latency_s=1e-6) == pytest.approx(1.5e-3 + 6e-6)
    # one rank reads everything but the embedding; more ranks read less, never below the head
    head = LLAMA3_8B.vocab_size * LLAMA3_8B.hidden_size
    assert rank_parameters(LLAMA3_8B, 1) == rank_weights_read(LLAMA3_8B, 1) + head + 65 * 4096
    assert head < rank_weights_read(LLAMA3_8B, 8) < rank_weights_read(LLAMA3_8B, 2)


def test_the_figure_draws_each_rank_of_each_projection() -> None:
    fig = plot_split(CONFIG, world=2)
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) == 7 * 2
    assert len(fig.axes[0].get_lines()) == 2  # the two all-reduces

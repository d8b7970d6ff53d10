"""Figures drawn from the code: the state machine shows exactly the transition table, and the
batching and block-size figures draw what their runs measured."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import llmengine  # noqa: E402
from llmengine.lessons.diagrams import draw_state_machine  # noqa: E402
from llmengine.scheduling.request import TRANSITIONS  # noqa: E402


def test_state_machine_draws_every_state_and_every_move() -> None:
    fig, ax = plt.subplots()
    draw_state_machine(ax, highlight=("preempt",), highlight_color="#ff0000")
    labels = [text.get_text() for text in ax.texts if text.get_text()]
    arrows = [text for text in ax.texts if isinstance(text, matplotlib.text.Annotation)]
    events = [event for moves in TRANSITIONS.values() for event in moves.values()]
    states = [state.value for state in TRANSITIONS]
    assert sorted(labels) == sorted(events + states)
    assert len(arrows) == len(events)
    red = [t.get_text() for t in ax.texts if matplotlib.colors.to_hex(t.get_color()) == "#ff0000"]
    assert red == ["preempt"]
    plt.close(fig)


def _burst_runs(model: llmengine.Llama) -> dict:
    workload = llmengine.with_budgets(
        llmengine.uniform_burst(4, 5, 1, vocab_size=model.config.vocab_size, seed=1), [6, 2, 2, 2]
    )
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=4)
    return {
        "static": llmengine.run_static_batches(model, workload, num_slots=4).timing(),
        "continuous": llmengine.run_workload(engine, workload).timing(),
    }


def test_rows_per_forward_stacks_finished_rows_on_live_ones(model: llmengine.Llama) -> None:
    from llmengine.lessons.rows_per_forward import plot_rows_per_forward

    runs = _burst_runs(model)
    fig = plot_rows_per_forward(runs, num_slots=4, budgets=[6, 2, 2, 2])
    for axis, timing in zip(fig.axes, runs.values(), strict=True):
        heights = [patch.get_height() for patch in axis.patches]
        assert sum(heights) == sum(timing.rows)  # live and finished rows, every forward
    plt.close(fig)


def test_continuous_against_static_keeps_colours_and_shows_positions_on_a_log_scale(
    model: llmengine.Llama,
) -> None:
    from llmengine.lessons.continuous_vs_static_figure import plot_continuous_against_static

    fig = plot_continuous_against_static(_burst_runs(model), "title")
    rows_axis, positions_axis, *_ = fig.axes
    assert positions_axis.get_yscale() == "log"
    for axis in fig.axes:
        colours = [matplotlib.colors.to_hex(line.get_color()) for line in axis.get_lines()]
        assert colours == ["#ff7f0e", "#1f77b4"]  # static drawn first, the engine on top
        assert axis.get_legend() is None  # one legend for the figure, outside the panels
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["continuous", "static"]
    plt.close(fig)


def test_block_size_trade_draws_waste_and_table_length() -> None:
    from llmengine.lessons.block_size_trade import plot_block_size_trade
    from llmengine.lessons.fragmentation import measure_tail_waste

    measured = [measure_tail_waste([5, 17, 30], size) for size in (1, 4, 16)]
    fig = plot_block_size_trade(measured)
    waste_axis, entries_axis = fig.axes
    assert len(waste_axis.get_lines()) == 2 and len(entries_axis.get_lines()) == 1
    assert entries_axis.get_yscale() == "log"
    plt.close(fig)

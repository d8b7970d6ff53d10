"""Lesson 22's figures: the positions each step computes under each budget, and the gaps the
decoding requests see against the long prompt's wait.

One colour per budget in every panel of both figures (`BUDGET_COLOURS`). The functions return
the figure; the lesson saves it with `artifacts.save_figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from llmengine.bench.batchbench import WorkloadRun
from llmengine.lessons.chunked_prefill import prefill_steps, token_times

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BUDGET_COLOURS = {None: "#d62728", 32: "#1f77b4", 64: "#2ca02c", 128: "#9467bd"}
ARRIVAL_COLOUR = "#555555"


def budget_label(budget: int | None) -> str:
    """A budget as the tables print it: "none" for no budget."""
    return "none" if budget is None else str(budget)


def _colour(budget: int | None) -> str:
    return BUDGET_COLOURS.get(budget, "#333333")


def plot_positions_per_step(
    runs: Mapping[int | None, WorkloadRun], arrival: int, long_index: int
) -> Figure:
    """One panel per budget, stacked on one iteration axis: the positions each forward
    computed (log scale), the steps that carried the long prompt's prefill shaded."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.7 * len(runs) + 1.0), sharex=True)
    longest = max(len(run.outcomes) for run in runs.values())
    most = max(max(run.timing().forward_tokens) for run in runs.values())
    for ax, (budget, run) in zip(axes, runs.items(), strict=True):
        positions = run.timing().forward_tokens
        steps = range(1, len(positions) + 1)
        colour = _colour(budget)
        ax.fill_between(steps, positions, step="mid", color=colour, alpha=0.25, lw=0)
        ax.step(steps, positions, where="mid", color=colour, lw=1.6)
        for number in prefill_steps(run, long_index):  # 0-based forwards
            ax.axvspan(number + 0.5, number + 1.5, color=colour, alpha=0.12, lw=0)
        ax.axvline(arrival + 0.5, color=ARRIVAL_COLOUR, ls="--", lw=0.9)
        ax.set(yscale="log", ylim=(0.7, 2.5 * most), xlim=(0, longest + 2))
        ax.text(
            0.99,
            0.9,
            f"max_num_batched_tokens = {budget_label(budget)}: {len(positions)} steps, "
            f"at most {max(positions)} positions",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=9,
            color=colour,
        )
    axes[0].text(
        arrival, 1.2 * most, "the long prompt arrives ", ha="right", va="top", fontsize=9,
        color=ARRIVAL_COLOUR,
    )  # fmt: skip
    axes[0].set_title("Positions per step: the long prompt in one forward, or spread over several")
    axes[-1].set_xlabel("iteration (shaded: the steps that carry the long prompt's prefill)")
    fig.supylabel("positions computed in the forward", fontsize=10)
    return fig


def plot_gaps_and_waits(
    wall_runs: Mapping[int | None, Sequence[WorkloadRun]],
    medians: Mapping[int | None, Mapping[str, tuple[float, float, float]]],
    arrival_s: float,
) -> Figure:
    """Left: the inter-token gaps of short request 0 in the first run of each budget, each
    gap drawn across the interval it lasted. Right: per budget, the median worst gap of the
    short requests beside the median TTFT of the long prompt (`medians[budget][field][0]`)."""
    import matplotlib.pyplot as plt

    fig, (ax_gaps, ax_bars) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.6, 1]}
    )
    for budget, repeats in wall_runs.items():
        times = token_times(repeats[0])[0]
        ax_gaps.step(
            [1e3 * later for later in times[1:]],
            [1e3 * (later - earlier) for earlier, later in pairwise(times)],
            where="pre",
            lw=1.2,
            color=_colour(budget),
            label=f"max_num_batched_tokens = {budget_label(budget)}",
        )
    ax_gaps.axvline(1e3 * arrival_s, color=ARRIVAL_COLOUR, ls="--", lw=0.9)
    ax_gaps.set(
        yscale="log",
        xlabel="time in the run (ms)",
        ylabel="gap before this token (ms)",
        title="Inter-token gaps of short request 0 (one run per budget)",
    )
    ax_gaps.legend(fontsize=8, loc="upper right")
    budgets = list(medians)
    x = range(len(budgets))
    worst = [1e3 * medians[b]["worst_gap_s"][0] for b in budgets]
    ttft = [1e3 * medians[b]["long_ttft_s"][0] for b in budgets]
    ax_bars.bar([i - 0.2 for i in x], worst, 0.38, color="#444444", label="worst gap")
    ax_bars.bar([i + 0.2 for i in x], ttft, 0.38, color="#e6550d", label="long prompt's TTFT")
    ax_bars.set(
        xticks=list(x),
        xticklabels=[budget_label(b) for b in budgets],
        xlabel="max_num_batched_tokens",
        ylabel="ms (median of the runs)",
        ylim=(0, 1.3 * max(worst + ttft)),
        title="The stall against the long prompt's wait",
    )
    for tick, budget in zip(ax_bars.get_xticklabels(), budgets, strict=True):
        tick.set_color(_colour(budget))
    ax_bars.legend(fontsize=8, loc="upper center", ncols=2)
    return fig

"""Lesson 16's figure: tokens kept per request, step by step, under each victim rule.

One panel per (victims, rule) run of `victim_rules.run_rule`: resume on the top row, restart
below, a rule per column. Each request keeps its colour in every panel, a cross marks an
eviction at the tokens the victim held, and a looping run has its cycle shaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmengine.lessons.victim_rules import Trace

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REQUEST_COLORS = ("#2c7fb8", "#e6550d")  # r0, r1
BUDGET_LINE, LOOP_SHADE, EVICTION_KEY = "#999999", "#fdd0a2", "#555555"
TOP = 7.6  # tokens axis: room above the budget line for each panel's note


def draw_victim_traces(
    traces: Mapping[tuple[str, str], Trace],
    victims: Sequence[str],
    rules: Sequence[str],
    budget: int,
    title: str,
) -> Figure:
    """A grid of `victims` (rows) by `rules` (columns); `traces[victims, rule]` fills a panel,
    and `budget` (every request's, the same) is the dotted line tokens kept can reach."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(victims), len(rules), figsize=(13, 7), sharex=True, sharey=True, squeeze=False
    )
    for row, kind in enumerate(victims):
        for col, rule in enumerate(rules):
            ax = axes[row][col]
            _draw_trace(ax, traces[kind, rule], budget)
            ax.set_title(f"{kind}, evict the {rule}", fontsize=10)
            ax.set(ylim=(0, TOP), xlim=(0, 13))
            if col == 0:
                ax.set_ylabel("tokens kept")
            if row == len(victims) - 1:
                ax.set_xlabel("step")
    handles = axes[0][0].get_legend_handles_labels()[0]
    handles.append(
        plt.Line2D([], [], marker="X", color=EVICTION_KEY, ls="", label="evicted (tokens held)")
    )
    axes[0][0].legend(handles=handles, loc="lower right", fontsize=8)
    fig.suptitle(title)
    return fig


def _draw_trace(ax: Axes, trace: Trace, budget: int) -> None:
    steps = [0] + [step.number for step in trace.steps]
    for rid, color in enumerate(REQUEST_COLORS):
        kept = [0] + [step.generated[rid] for step in trace.steps]
        ax.step(steps, kept, where="post", color=color, lw=3.2 - rid, label=f"r{rid}")
        # The cross sits at the tokens the victim held when it was evicted.
        for step in trace.steps:
            if rid in step.evicted:
                ax.plot(step.number, kept[step.number - 1], "X", color=color, ms=9)
    ax.axhline(budget, color=BUDGET_LINE, ls=":", lw=1)
    if trace.livelocked:
        ax.axvspan(trace.first_seen, trace.repeated_at, color=LOOP_SHADE, zorder=0)
        note = f"state after {trace.repeated_at} = state after {trace.first_seen}: loops forever"
        ax.text(6.5, TOP - 0.2, note, ha="center", va="top", fontsize=8)
    else:
        note = f"drained in {len(trace.steps)}"
        ax.text(len(trace.steps), TOP - 0.2, note, ha="right", va="top", fontsize=8)

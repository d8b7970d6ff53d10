"""Lesson 14's figure: the recompute bill of a pool sweep, counted in rows and in positions.

Four panels. Top left, one iteration counted both ways: each row is 1 in the first bar and its
positions in the second. Bottom left, every request of a cramped run forward by forward, its
evictions crossed and each resumed prefill labelled with its positions, the finishing
iteration at the end of each lane and the run's mean latency as a line. Top right, the sweep:
rows issued against positions computed, split into those computed once and those recomputed.
Bottom right, the bill's two currencies per pool: the recompute share of the forward, and the
victims' latency over the others'. One colour per kind of row in every panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from llmengine.bench.batchbench import PoolResult
from llmengine.lessons.artifacts import use_lesson_style
from llmengine.outcome import IterationOutcome

DECODE, RESUMED, PREFILL, EVICTED = "#2c7fb8", "#e6550d", "#7fcdbb", "#c0392b"
ROWS_ISSUED, HIGHLIGHT = "#bdbdbd", "#fee6ce"
ROW_COLORS = {"decode": DECODE, "resumed prefill": RESUMED, "prefill": PREFILL}


def row_kind(outcome: IterationOutcome, request_id: int) -> str:
    """What a request's row in this forward is: a decode, a first prefill, or a resumed one."""
    if request_id in outcome.resumed:
        return "resumed prefill"
    return "prefill" if request_id in outcome.admitted else "decode"


def draw_one_iteration(
    ax: Axes, example: IterationOutcome, names: Mapping[int, str], pool_blocks: int
) -> None:
    """One forward of the `pool_blocks` run as two bars: its rows counted 1 each, then counted
    in positions."""
    for bar, counts in enumerate(["rows", "positions"]):
        left = 0
        for request_id, positions in example.row_positions.items():
            resumed = request_id in example.resumed
            width = 1 if counts == "rows" else positions
            color = RESUMED if resumed else DECODE
            ax.barh(
                bar,
                width,
                left=left,
                color=color,
                edgecolor="white",
                hatch="//" if resumed and counts == "positions" else None,
            )
            # On a solid patch of the row's colour, so the label reads over the hatching.
            ax.text(
                left + width / 2,
                bar,
                f"{names[request_id]}\n{width}",
                ha="center",
                va="center",
                color="white",
                fontsize=9,
                bbox={"facecolor": color, "edgecolor": "none", "pad": 1.5},
            )
            left += width
        ax.text(left + 0.3, bar, f"= {left}", va="center")
    ax.set(
        yticks=[0, 1],
        yticklabels=["counted in rows", "counted in positions"],
        xlabel="units",
        xlim=(0, example.forward_tokens + 3),
        title=f"iteration {example.iteration + 1} of the {pool_blocks}-block run, counted two ways",
    )
    ax.invert_yaxis()
    ax.legend(
        handles=[
            Patch(color=DECODE, label="decode row: 1 position"),
            Patch(
                facecolor=RESUMED,
                hatch="//",
                edgecolor="white",
                label="resumed row: prompt + kept tokens, recomputed",
            ),
        ],
        loc="upper right",
        fontsize=8,
    )


def draw_staircase(ax: Axes, run: PoolResult, names: Mapping[int, str]) -> None:
    """Every request of `run`, forward by forward: the kind of each row, the evictions, the
    positions of each resumed prefill, and the iteration each request finished in."""
    forwards = run.run.outcomes
    for lane, request_id in enumerate(run.run.request_ids):
        for number, outcome in enumerate(forwards, start=1):
            if request_id not in outcome.row_positions:
                continue
            kind = row_kind(outcome, request_id)
            ax.broken_barh([(number - 0.5, 1)], (lane - 0.3, 0.6), color=ROW_COLORS[kind])
            if kind == "resumed prefill":
                ax.annotate(
                    str(outcome.row_positions[request_id]),
                    (number, lane - 0.3),
                    xytext=(0, 1),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color=RESUMED,
                )
        for number in run.timing.preempted_at.get(request_id, []):
            ax.plot(number, lane, marker="X", color=EVICTED, ms=8, ls="")
        latency = run.timing.latencies_iterations[request_id]
        ax.annotate(str(latency), (latency + 0.8, lane), va="center", fontsize=9)
    mean_latency = run.timing.mean_latency_iterations
    ax.axvline(mean_latency, color="#333333", ls="--", lw=1)
    ax.annotate(f"mean {mean_latency:.0f} describes nobody", (mean_latency + 0.8, -0.6), fontsize=9)
    lane_labels = list(names.values())
    lane_labels[0] += " (oldest)"
    lane_labels[-1] += " (youngest)"
    ax.set(
        yticks=range(len(names)),
        yticklabels=lane_labels,
        xlabel="iteration",
        xlim=(0, len(forwards) + 12),
        ylim=(len(names) - 0.4, -0.9),
        title=f"the {run.pool_blocks}-block staircase (number: the iteration it finished)",
    )
    ax.legend(
        handles=[
            Patch(color=PREFILL, label="first prefill"),
            Patch(color=DECODE, label="decode"),
            Patch(color=RESUMED, label="resumed prefill (positions)"),
            Line2D([], [], marker="X", color=EVICTED, ls="", label="evicted"),
        ],
        loc="upper right",
        bbox_to_anchor=(1.0, 0.9),
        fontsize=8,
    )


def draw_rows_and_positions(ax: Axes, sweep: Sequence[PoolResult], highlight: int) -> None:
    """Per pool: the rows issued beside the positions computed, once and again."""
    x = range(len(sweep))
    first_time = [r.timing.total_forward_tokens - r.timing.total_recomputed_tokens for r in sweep]
    again = [r.timing.total_recomputed_tokens for r in sweep]
    ax.bar(
        [i - 0.2 for i in x],
        [sum(r.timing.rows) for r in sweep],
        0.38,
        color=ROWS_ISSUED,
        label="rows issued",
    )
    ax.bar(
        [i + 0.2 for i in x],
        first_time,
        0.38,
        color=DECODE,
        label="positions computed once (prefills, decodes)",
    )
    ax.bar(
        [i + 0.2 for i in x],
        again,
        0.38,
        bottom=first_time,
        color=RESUMED,
        hatch="//",
        edgecolor="white",
        label="positions of resumed prefills",
    )
    for i, result in enumerate(sweep):
        ax.text(
            i + 0.2,
            result.timing.total_forward_tokens + 4,
            str(result.timing.total_forward_tokens),
            ha="center",
            fontsize=9,
            fontweight="bold" if i == highlight else "normal",
        )
    top = max(r.timing.total_forward_tokens for r in sweep)
    ax.axvspan(highlight - 0.5, highlight + 0.5, color=HIGHLIGHT, zorder=0)
    ax.set(
        xticks=list(x),
        xticklabels=[str(result.pool_blocks) for result in sweep],
        xlabel="pool (blocks)",
        ylim=(0, 1.16 * top),
        ylabel="per run",
        title="rows cannot see the bill, positions can",
    )
    ax.legend(loc="upper left", fontsize=8)


def draw_two_currencies(ax: Axes, sweep: Sequence[PoolResult], highlight: int) -> None:
    """Per pool: the recompute share (bars, positions per eviction written in them) and, on a
    second axis, the victims' latency over the others' where the pool had victims."""
    x = range(len(sweep))
    shares = [100 * r.timing.recompute_fraction for r in sweep]
    ax.bar(x, shares, 0.6, color=RESUMED, label="recompute share of the forward (%): the FLOPs")
    for i, result in enumerate(sweep):
        per_eviction = result.timing.tokens_per_eviction
        if per_eviction is not None:
            # At the foot of the bar, clear of the victim-latency line drawn across the bars.
            ax.text(
                i,
                1,
                f"{per_eviction:.1f}\n/evict",
                ha="center",
                va="bottom",
                color="white",
                fontsize=8,
            )
    ax.axvspan(highlight - 0.5, highlight + 0.5, color=HIGHLIGHT, zorder=0)
    ax.set(
        xticks=list(x),
        xticklabels=[str(result.pool_blocks) for result in sweep],
        xlabel="pool (blocks)",
        ylim=(0, 1.6 * max(shares)),
        ylabel="recompute share (%)",
        title="one event, two currencies",
    )
    victims = ax.twinx()
    # A pool with no victims has no victim latency: its guard value 1.0 is marked, not plotted.
    preempting = [i for i, result in enumerate(sweep) if result.timing.preemptions]
    penalties = [sweep[i].timing.preemption_latency_penalty for i in preempting]
    victims.plot(
        preempting,
        penalties,
        "o-",
        color=EVICTED,
        label="victim latency over straight-through (x): paid by the victim",
    )
    for i, result in enumerate(sweep):
        if not result.timing.preemptions:
            victims.text(i, 0.1, "no victims", ha="center", fontsize=8, color=EVICTED)
    victims.set(ylim=(0, 1.25 * max(penalties, default=1.0)), ylabel="victim latency (x)")
    victims.grid(False)
    handles = ax.get_legend_handles_labels()[0] + victims.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=8)


def draw_recompute_bill(
    sweep: Sequence[PoolResult],
    example: IterationOutcome,
    cramped: PoolResult,
    roomy: PoolResult,
    names: Mapping[int, str],
) -> Figure:
    """The four panels: `example` is one forward of `cramped`, the pool shaded in the sweep
    panels; `roomy` is the pool that evicts nobody, named in the title with `cramped`."""
    use_lesson_style()
    fig = plt.figure(figsize=(13, 7.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.15])
    highlight = [result.pool_blocks for result in sweep].index(cramped.pool_blocks)
    draw_one_iteration(fig.add_subplot(grid[0, 0]), example, names, cramped.pool_blocks)
    draw_staircase(fig.add_subplot(grid[1, 0]), cramped, names)
    draw_rows_and_positions(fig.add_subplot(grid[0, 1]), sweep, highlight)
    draw_two_currencies(fig.add_subplot(grid[1, 1]), sweep, highlight)
    fig.suptitle(
        f"Same {roomy.timing.total_tokens} tokens at every pool size: "
        f"{roomy.timing.total_forward_tokens} forward positions at {roomy.pool_blocks} blocks, "
        f"{cramped.timing.total_forward_tokens} at {cramped.pool_blocks}"
    )
    return fig

"""The stress test's figure (lesson 15): evictions per request, and the pool over time.

One colour means one thing across both panels: blue and orange are the greedy and the sampled
requests, grey is an abort (a bar, a marker, a dotted line), red is an eviction, and the
blocks held get a colour of their own, so that no line on the right borrows a request kind's
colour from the left.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from llmengine.lessons.stress import StressRun

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GREEDY, SAMPLED = "#2c7fb8", "#e6550d"
EVICTED, ABORTED, HELD, POOL_LINE = "#c0392b", "#636363", "#31a354", "#333333"
ABORT_MARKERS = {"waiting": "v", "running": "o", "preempted": "X"}


def draw_stress_test(run: StressRun, sampled: Collection[int], pool: int, slots: int) -> Figure:
    """Both panels of one stress run: `sampled` holds the workload indices of sampled requests."""
    import matplotlib.pyplot as plt

    fig, (ax_evictions, ax_pool) = plt.subplots(
        1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.0, 1.4]}
    )
    _draw_evictions(ax_evictions, run, sampled)
    _draw_pool(ax_pool, run, pool)
    fig.suptitle(
        f"{len(run.request_ids)} requests, {slots} slots, {pool} blocks: {run.num_steps} steps, "
        f"{run.num_evictions} evictions, the roomy text every time"
    )
    return fig


def _draw_evictions(ax, run: StressRun, sampled: Collection[int]) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    most = max(run.evictions)
    for index, count in enumerate(run.evictions):
        kind = ABORTED if index in run.aborted else SAMPLED if index in sampled else GREEDY
        ax.bar(index, count, color=kind)
    for record in run.aborts:
        # An aborted request's bar counts its evictions before the abort; the marker says when.
        ax.plot(
            record.index,
            run.evictions[record.index] + 0.15,
            marker=ABORT_MARKERS[record.state],
            color=ABORTED,
            ls="",
        )
    ax.set(
        xlabel="request (arrival order)",
        ylabel="times evicted",
        yticks=range(most + 1),
        ylim=(0, most + 1.8),  # the headroom above the tallest bar holds the legend
        xlim=(-1, len(run.request_ids)),
        title=f"evictions per request ({run.num_evictions} in all)",
    )
    aborted = [
        plt.Line2D([], [], marker=marker, color=ABORTED, ls="", label=f"aborted while {state}")
        for state, marker in ABORT_MARKERS.items()
    ]
    ax.legend(
        handles=[
            Patch(color=GREEDY, label="greedy"),
            Patch(color=SAMPLED, label="sampled (seeded)"),
            *aborted,
        ],
        loc="upper center",
        fontsize=8,
        ncols=3,
    )


def _draw_pool(ax, run: StressRun, pool: int) -> None:
    steps = [snapshot.step for snapshot in run.snapshots]
    held = [snapshot.held_blocks for snapshot in run.snapshots]
    ax.step(steps, held, where="mid", color=HELD, lw=1, label="blocks held in the forward")
    ax.axhline(pool, color=POOL_LINE, ls="--", lw=1, label=f"the pool ({pool} blocks)")
    evicting = [snapshot.step for snapshot in run.snapshots if snapshot.evicted]
    ax.plot(
        evicting,
        [pool + 0.5] * len(evicting),
        marker="|",
        ls="",
        color=EVICTED,
        ms=8,
        label=f"a step that evicted ({len(evicting)} steps)",
    )
    for record in run.aborts:
        ax.axvline(record.step - 0.5, color=ABORTED, lw=1, ls=":")
        ax.annotate(
            f"abort r{record.index}\n{record.state}",
            (record.step, 1.0),
            fontsize=7,
            color=ABORTED,
            xytext=(2, 0),
            textcoords="offset points",
        )
    ax.set(
        xlabel="step",
        ylabel="blocks",
        ylim=(0, pool + 3.5),
        xlim=(0, run.num_steps + 1),
        title="the pool over time",
    )
    ax.legend(loc="upper right", fontsize=8, ncols=3)

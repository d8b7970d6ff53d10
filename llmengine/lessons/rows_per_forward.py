"""Lesson 09's picture: the rows each forward computes, live and finished, one panel per run.

matplotlib is imported inside the function: `import llmengine` works without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmengine.bench.timing import ContinuousTiming

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LIVE_COLOR, DONE_COLOR = "tab:blue", "tab:red"


def plot_rows_per_forward(
    runs: Mapping[str, ContinuousTiming], num_slots: int, budgets: Sequence[int]
) -> Figure:
    """One bar per forward and panel per run: rows of requests still producing tokens below,
    rows computed for requests that already have all theirs stacked on top."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(10, 3.8), sharey=True)
    for axis, (name, timing) in zip(axes, runs.items(), strict=True):
        steps = range(1, timing.iterations + 1)
        kept = timing.tokens_collected
        done = [rows - live for rows, live in zip(timing.rows, kept, strict=True)]
        axis.bar(steps, kept, width=0.85, color=LIVE_COLOR, label="row of a live request")
        axis.bar(
            steps,
            done,
            bottom=kept,
            width=0.85,
            color=DONE_COLOR,
            alpha=0.55,
            label="row of a finished request",
        )
        axis.set_title(f"{name}: {sum(timing.rows)} rows in {timing.iterations} forwards")
        axis.set_xlabel("iteration (forward)")
    axes[0].set_ylabel("rows computed")
    axes[0].set_ylim(0, num_slots + 2)
    axes[0].legend(loc="upper right", ncols=2)
    short, long = min(budgets), max(budgets)
    fig.suptitle(
        f"One long request among short ones: {budgets.count(short)} want {short} tokens, "
        f"{budgets.count(long)} wants {long}, {num_slots} slots"
    )
    return fig

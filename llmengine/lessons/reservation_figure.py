"""Lesson 12's figure: lesson 09's burst under worst-case reservation and incremental allocation.

Two panels. Left, how many requests the first forward admits at each pool size, one step line
per policy, with a dotted line where each runs all of them at once. Right, one run per policy
with room for everybody: the blocks each holds per iteration against the blocks the K/V
written fills (the same for both), the gap shaded as the reserve rule's reservation waste.
Each policy keeps one colour in both panels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from llmengine.bench.batchbench import PoolResult
from llmengine.bench.timing import ContinuousTiming
from llmengine.lessons.artifacts import use_lesson_style

POLICY_COLORS = {"reserve": "tab:orange", "incremental": "tab:blue"}


def draw_worst_case_reservation(
    sweeps: Mapping[str, Sequence[PoolResult]],
    smallest: Mapping[str, int | None],
    timings: Mapping[str, ContinuousTiming],
) -> Figure:
    """The two panels from a pool sweep per policy (`sweeps`), the smallest pool running all
    at once per policy (`smallest`), and one roomy run's timing per policy (`timings`)."""
    use_lesson_style()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0))
    for policy, results in sweeps.items():
        color = POLICY_COLORS[policy]
        left.step(
            [result.pool_blocks for result in results],
            [result.timing.rows[0] for result in results],
            where="post",
            color=color,
            label=f"{policy}: all at once from {smallest[policy]}",
        )
        if smallest[policy] is not None:
            left.axvline(smallest[policy], color=color, linestyle=":", linewidth=1)
    left.set(
        title="requests in the first forward",
        xlabel="pool size (blocks)",
        ylabel="requests running at once",
    )
    left.legend(loc="lower right")

    written = next(iter(timings.values())).needed_blocks
    if any(timing.needed_blocks != written for timing in timings.values()):
        raise ValueError("the runs wrote different K/V: not one workload")
    steps = range(1, len(written) + 1)
    if "reserve" in timings:
        right.fill_between(
            steps,
            written,
            timings["reserve"].held_blocks,
            step="mid",
            color=POLICY_COLORS["reserve"],
            alpha=0.2,
            label="reserved, not written",
        )
    for policy, timing in timings.items():
        # Incremental allocation holds exactly what is written: a wide pale line under the
        # dashed one keeps it visible.
        same = timing.held_blocks == written
        right.step(
            steps,
            timing.held_blocks,
            where="mid",
            color=POLICY_COLORS[policy],
            linewidth=5 if same else 1.5,
            alpha=0.5 if same else 1.0,
            label=f"{policy}: held" + (" (= written)" if same else ""),
        )
    right.step(steps, written, where="mid", color="black", linestyle="--", label="written (both)")
    right.set(title="blocks held and blocks written", xlabel="iteration", ylabel="blocks")
    right.legend(loc="upper right")
    fig.suptitle("Lesson 09's burst under worst-case reservation and under incremental allocation")
    return fig

"""Lesson 17's figure: preemptions and iterations against the watermark, one line per pool.

A column per workload, preemptions above and iterations below. Each pool keeps one colour in
every panel, so a pool that two workloads share (16 and 12 blocks) is the same colour in
both columns; a pool's line stops where its door refuses the watermark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmengine.lessons.watermarks import WatermarkRun

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def pool_colors(pools: Sequence[int]) -> dict[int, str]:
    """One colour per distinct pool, the largest pool first."""
    distinct = sorted(set(pools), reverse=True)
    if len(distinct) > len(PALETTE):
        raise ValueError(f"{len(distinct)} pools, {len(PALETTE)} colours")
    return dict(zip(distinct, PALETTE, strict=False))


def draw_watermark_sweep(
    sweeps: Mapping[str, Sequence[WatermarkRun]],
    pools: Mapping[str, Sequence[int]],
    rules: Sequence[str],
    title: str,
) -> Figure:
    """`sweeps[name]` holds a workload's cells, `pools[name]` the pools to draw, `rules` the
    fixed-watermark rules (by name) whose cells make the lines."""
    import matplotlib.pyplot as plt

    colors = pool_colors([pool for name in sweeps for pool in pools[name]])
    fig, axes = plt.subplots(2, len(sweeps), figsize=(11, 6.6), sharex=True, squeeze=False)
    for column, (name, cells) in enumerate(sweeps.items()):
        top, bottom = axes[0, column], axes[1, column]
        for pool in pools[name]:
            line = [
                cell
                for cell in cells
                if cell.pool_blocks == pool and cell.rule in rules and cell.timing is not None
            ]
            watermarks = [cell.watermark for cell in line]
            style = {"color": colors[pool], "marker": "o", "label": f"{pool} blocks"}
            top.plot(watermarks, [cell.timing.preemptions for cell in line], **style)
            bottom.plot(watermarks, [cell.timing.iterations for cell in line], **style)
        top.set(title=f"{name}: preemptions", ylabel="preemptions")
        bottom.set(title=f"{name}: iterations", xlabel="watermark (blocks)", ylabel="iterations")
        bottom.set_xticks(range(len(rules)))
        # Outside the axes, to the right of the column, the legend covers no point.
        top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="pool")
    fig.suptitle(title)
    return fig

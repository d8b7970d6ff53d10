"""Lesson 08's picture of the block-size trade: tail waste against block-table length.

matplotlib is imported inside the function: `import llmengine` works without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmengine.lessons.fragmentation import TailWaste

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_block_size_trade(measured: Sequence[TailWaste]) -> Figure:
    """Two panels over the block sizes measured: the empty share of the cache (with the
    `b - 1` per sequence bound), and the mean number of block-table entries per sequence."""
    import matplotlib.pyplot as plt

    sizes = [w.block_size for w in measured]
    fig, (waste_axis, entries_axis) = plt.subplots(1, 2, figsize=(8.0, 3.6), layout="constrained")
    waste_axis.plot(sizes, [100 * w.waste_fraction for w in measured], "o-", label="measured")
    waste_axis.plot(
        sizes,
        [100 * w.bound / w.reserved_positions for w in measured],
        "--",
        label="bound: b−1 per sequence",
    )
    waste_axis.set(
        xscale="log", xlabel="block size", ylabel="empty positions (% of cache)", title="tail waste"
    )
    waste_axis.legend()
    entries_axis.plot(
        sizes, [w.blocks / w.num_sequences for w in measured], "o-", color="tab:green"
    )
    entries_axis.set(
        xscale="log",
        yscale="log",
        xlabel="block size",
        ylabel="entries per sequence",
        title="block table length",
    )
    for axis in (waste_axis, entries_axis):
        axis.set_xticks(sizes, [str(size) for size in sizes])
    return fig

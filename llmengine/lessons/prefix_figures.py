"""Lesson 21's figures: where each prefill's positions came from, and what a sweep's recompute
bill looks like with and without prefix caching.

Both draw with the lessons' style (`artifacts.use_lesson_style`) and return the figure; the
lesson saves it with `artifacts.save_figure`. One colour per kind of position in both: blue is
computed for the first time, red recomputed, orange taken from the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmengine.bench.batchbench import PoolResult
from llmengine.lessons.prefix_sharing import Admission

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COMPUTED = "#4c72b0"
RECOMPUTED = "#c44e52"
CACHED = "#dd8452"


def plot_prefill_split(admitted: Sequence[Admission], title: str) -> Figure:
    """One bar per admission, in order: the positions its prefill computed, and above them
    those it took from the cache."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = [f"r{admission.index}" for admission in admitted]
    computed = [admission.computed for admission in admitted]
    ax.bar(names, computed, color=COMPUTED, label="computed by the prefill")
    ax.bar(
        names,
        [admission.cached for admission in admitted],
        bottom=computed,
        color=CACHED,
        label="taken from the cache",
    )
    ax.set(xlabel="request, in order of admission", ylabel="prompt positions", title=title)
    ax.set_ylim(0, 1.3 * max(admission.tokens for admission in admitted))
    ax.legend(loc="upper right", ncols=2)
    return fig


def plot_recompute_split(
    sweeps: dict[bool, Sequence[PoolResult]], block_size: int, title: str
) -> Figure:
    """Each pool of a sweep as two bars, without caching (left, plain) and with it (right,
    hatched): positions computed for the first time, recomputed, and taken from the cache."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    tallest = 0
    for offset, caching in ((-width / 2, False), (width / 2, True)):
        results = sweeps[caching]
        again = [r.timing.total_recomputed_tokens for r in results]
        first = [r.timing.total_forward_tokens - a for r, a in zip(results, again, strict=True)]
        cached = [sum(o.cached_tokens for o in r.run.outcomes) for r in results]
        x = [index + offset for index in range(len(results))]
        hatch = "//" if caching else None
        tops = [a + b for a, b in zip(first, again, strict=True)]
        ax.bar(x, first, width, color=COMPUTED, hatch=hatch, edgecolor="white")
        ax.bar(x, again, width, bottom=first, color=RECOMPUTED, hatch=hatch, edgecolor="white")
        ax.bar(x, cached, width, bottom=tops, color=CACHED, hatch=hatch, edgecolor="white")
        tallest = max(tallest, *(t + c for t, c in zip(tops, cached, strict=True)))
    pools = [result.pool_blocks for result in sweeps[False]]
    ax.set_xticks(range(len(pools)), [str(pool) for pool in pools])
    ax.legend(
        handles=[
            Patch(color=COMPUTED, label="computed for the first time"),
            Patch(color=RECOMPUTED, label="recomputed"),
            Patch(color=CACHED, label="taken from the cache"),
            Patch(facecolor="white", edgecolor="grey", hatch="//", label="caching on (right bar)"),
        ],
        loc="upper left",
        ncols=2,
    )
    ax.set_ylim(0, 1.25 * tallest)
    ax.set(xlabel=f"pool (blocks of {block_size} tokens)", ylabel="positions", title=title)
    return fig

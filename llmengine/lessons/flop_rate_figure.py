"""Lesson 23's figure: the FLOP/s a decode step achieves against its matrix products alone, by
rows in the step, one panel per model.

One colour per version in both panels (before red, after blue); the dashed line with circles is
the products alone (the roofline of a step made of them), the solid line with squares the whole
step. The function returns the figure; the lesson saves it with `artifacts.save_figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmengine.lessons.step_cost import DecodeCost

if TYPE_CHECKING:
    from matplotlib.figure import Figure

VERSION_COLOURS = {"before": "#d62728", "after": "#1f77b4"}


def plot_flop_rates(
    costs: Mapping[tuple[str, str], Mapping[int, DecodeCost]],
    model_names: Sequence[str],
    row_counts: Sequence[int],
) -> Figure:
    """`costs[name, version][rows]` as GFLOP/s on log-log axes, a panel per model name."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, len(model_names), figsize=(11, 4.8), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], model_names, strict=True):
        for version, colour in VERSION_COLOURS.items():
            by_rows = costs[name, version]
            for rate, style, marker, what in (
                ("products_flop_rate", "--", "o", "products alone"),
                ("step_flop_rate", "-", "s", "whole step"),
            ):
                ax.plot(
                    row_counts,
                    [getattr(by_rows[r], rate) / 1e9 for r in row_counts],
                    ls=style,
                    marker=marker,
                    color=colour,
                    label=f"{version}: {what}",
                )
        ax.set(xscale="log", yscale="log", xlabel="rows in the decode step", title=f"{name} model")
        ax.set_xticks(list(row_counts), [str(r) for r in row_counts])
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0][0].set_ylabel("GFLOP/s (one thread)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    return fig

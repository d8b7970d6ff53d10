"""Lesson 11's picture: one workload run by the engine and by the static runner, side by side.

Four panels, counted in forwards: rows per forward, positions per forward (pad included, on a
log scale so that the engine's short decode forwards stay visible beside the static runner's
padded prefills), and each request's time to first token and latency. Each batching keeps its
colour in every panel; one legend below the panels names them.

matplotlib is imported inside the function: `import llmengine` works without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llmengine.bench.timing import ContinuousTiming

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"continuous": "tab:blue", "static": "tab:orange"}


def plot_continuous_against_static(runs: Mapping[str, ContinuousTiming], title: str) -> Figure:
    """`runs` maps "continuous" and "static" to the timings of the same workload."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.8), layout="constrained")
    rows_axis, positions_axis, ttft_axis, latency_axis = axes.flat
    # The static runner first, so the engine's line is drawn on top of it.
    for batching in sorted(runs, key=lambda name: name != "static"):
        timing, color = runs[batching], COLORS.get(batching)
        steps = range(1, timing.iterations + 1)
        padded = timing.padded_tokens or [0] * timing.iterations
        positions = [a + b for a, b in zip(timing.forward_tokens, padded, strict=True)]
        rows_axis.step(steps, timing.rows, where="mid", color=color, label=batching)
        positions_axis.step(steps, positions, where="mid", color=color)
        requests = sorted(timing.latencies_s)
        ttft = [timing.time_to_first_token_s[r] for r in requests]
        latency = [timing.latencies_s[r] for r in requests]
        ttft_axis.plot(requests, ttft, "o-", markersize=3, color=color)
        latency_axis.plot(requests, latency, "o-", markersize=3, color=color)
    rows_axis.set(title="rows per forward", xlabel="iteration", ylabel="rows")
    positions_axis.set(
        title="positions computed per forward (pad included)",
        xlabel="iteration",
        ylabel="positions (log scale)",
        yscale="log",
    )
    positions_axis.yaxis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 50, 100, 200]))
    positions_axis.yaxis.set_major_formatter(ScalarFormatter())
    positions_axis.yaxis.set_minor_locator(NullLocator())
    ttft_axis.set(
        title="time to first token", xlabel="request (arrival order)", ylabel="iterations"
    )
    latency_axis.set(title="latency", xlabel="request (arrival order)", ylabel="iterations")
    handles, labels = rows_axis.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda index: labels[index])
    fig.legend(
        [handles[index] for index in order],
        [labels[index] for index in order],
        loc="outside lower center",
        ncols=len(labels),
    )
    fig.suptitle(title)
    return fig

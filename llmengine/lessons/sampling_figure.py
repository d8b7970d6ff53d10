"""Lesson 04's figure: the probability of the most likely tokens after each sampling knob.

Three panels, one per knob (temperature, top-k, top-p), each with the model's own
distribution (temperature 1, no cut) for comparison. A series keeps one colour in every panel
it appears in, so the reference line reads the same across the figure. matplotlib is imported
inside the function, as `artifacts` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from llmengine.sampling import SamplingParams, candidate_distribution

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REFERENCE = "temperature 1.0"
PANELS = {
    "temperature": ["temperature 0.5", REFERENCE, "temperature 1.5"],
    "top-k (temperature 1)": ["top_k 5", "top_k 50", REFERENCE],
    "top-p (temperature 1)": ["top_p 0.5", "top_p 0.9", REFERENCE],
}
SERIES_COLOURS = {
    REFERENCE: "#333333",
    "temperature 0.5": "#2c7fb8",
    "temperature 1.5": "#e15759",
    "top_k 5": "#f28e2b",
    "top_k 50": "#59a14f",
    "top_p 0.5": "#b07aa1",
    "top_p 0.9": "#76b7b2",
}


def ranked_probabilities(logits: torch.Tensor, params: SamplingParams, ranks: int) -> torch.Tensor:
    """The probabilities of the `ranks` most likely tokens after the knobs; a token the knobs
    cut has probability zero."""
    _, kept = candidate_distribution(logits, params)
    ranked = torch.zeros(ranks)
    ranked[: min(ranks, len(kept))] = kept[:ranks]
    return ranked


def plot_sampling_knobs(
    logits: torch.Tensor, settings: Mapping[str, SamplingParams], ranks: int = 60
) -> Figure:
    """One panel per knob of `PANELS`, each drawing the named `settings` over the first
    `ranks` ranks on a log axis, in the colours of `SERIES_COLOURS`."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11.0, 3.4), sharey=True)
    for ax, (title, names) in zip(axes, PANELS.items(), strict=True):
        for name in names:
            ranked = ranked_probabilities(logits, settings[name], ranks)
            label = f"{name} (no cut)" if name == REFERENCE else name
            ax.step(
                range(1, ranks + 1),
                ranked.numpy(),
                where="mid",
                color=SERIES_COLOURS[name],
                lw=1.2 if name == REFERENCE else 1.5,
                label=label,
            )
        ax.set(yscale="log", ylim=(1e-4, 1), xlabel="rank of the token", title=title)
        ax.legend(loc="upper right")
    axes[0].set_ylabel("probability after the knob")
    return fig

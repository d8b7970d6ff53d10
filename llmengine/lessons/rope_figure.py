"""Lesson 01's figure: the wavelength of every rotary channel pair, on a log axis.

Left, the embedded model's pairs against the longest position it can be given; right, Llama
3.1 8B's pairs with and without its `llama3` scaling, with the two wavelengths between which
the scaling blends. matplotlib is imported inside the function, as `artifacts` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmengine.model.config import Llama3RopeScaling

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def wavelengths(inverse_frequencies: torch.Tensor) -> list[float]:
    """Tokens per full turn of each channel pair: `2π / θ_i`."""
    return (2 * torch.pi / inverse_frequencies).tolist()


def plot_rope_wavelengths(
    embedded: torch.Tensor,
    max_positions: int,
    unscaled: torch.Tensor,
    scaled: torch.Tensor,
    scaling: Llama3RopeScaling,
) -> Figure:
    """Two panels: the embedded model's wavelengths against `max_positions`, and a large
    model's `unscaled` and `scaled` wavelengths with `scaling`'s two thresholds."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    left.semilogy(wavelengths(embedded), marker="o", ms=3)
    left.axhline(max_positions, ls="--", color="gray", label="max positions")
    left.set(
        xlabel="channel pair i", ylabel="wavelength (tokens)", title="embedded model (default rope)"
    )
    left.legend()
    right.semilogy(wavelengths(unscaled), label="default")
    right.semilogy(wavelengths(scaled), label=f"llama3 scaling, factor {scaling.factor:g}")
    context = scaling.original_max_position_embeddings
    for tokens, text in (
        (context / scaling.high_freq_factor, f"{context} / high_freq_factor"),
        (context / scaling.low_freq_factor, f"{context} / low_freq_factor"),
    ):
        right.axhline(tokens, ls=":", color="gray")
        right.text(1, tokens * 1.3, text, fontsize=8, color="gray")
    right.set(xlabel="channel pair i", ylabel="wavelength (tokens)", title="Llama 3.1 8B")
    right.legend(loc="lower right")
    return fig

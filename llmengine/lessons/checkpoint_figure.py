"""Lesson 02's figure: where each tensor's bytes sit in a safetensors file, and how far
converting the weights to bfloat16 moves each one.

matplotlib is imported inside the function, as `artifacts` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# One colour per kind of tensor, matched by a substring of its name (first match wins).
TENSOR_COLOURS = {
    "embed": "#2c7fb8",
    "self_attn": "#f28e2b",
    "mlp": "#59a14f",
    "norm": "#7f7f7f",
    "lm_head": "#e15759",
}


def bfloat16_rounding(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """`|w(bfloat16) - w| / |w|` for every non-zero weight, flattened into one tensor."""
    with torch.no_grad():
        return torch.cat(
            [((p.to(torch.bfloat16).float() - p) / p)[p != 0].abs() for p in parameters]
        )


def plot_checkpoint_layout(
    entries: Mapping[str, Mapping[str, Any]], parameters: Iterable[torch.Tensor]
) -> Figure:
    """Top: each tensor of a safetensors header (`entries`, name -> its `data_offsets`) as a
    bar at its byte range. Bottom: the histogram of `bfloat16_rounding(parameters)`, in
    percent, with the bound of an 8-bit significand."""
    import matplotlib.pyplot as plt

    fig, (layout, hist) = plt.subplots(2, 1, figsize=(7.0, 5.2), height_ratios=[1.0, 2.2])
    for name, entry in entries.items():
        start, end = entry["data_offsets"]
        color = next(value for key, value in TENSOR_COLOURS.items() if key in name)
        layout.barh(
            0,
            (end - start) / 2**20,
            left=start / 2**20,
            height=0.5,
            color=color,
            edgecolor="white",
            lw=0.3,
        )
    for key, value in TENSOR_COLOURS.items():
        if any(key in name for name in entries):
            layout.barh(0, 0, color=value, label=key)
    layout.set(
        yticks=[],
        ylim=(-0.4, 1.0),
        xlabel="offset in the data section (MiB)",
        title=f"inside model.safetensors: {len(entries)} tensors",
    )
    layout.legend(ncols=5, loc="upper center")
    rounding = bfloat16_rounding(parameters)
    hist.hist(100 * rounding.numpy(), bins=50, color="#2c7fb8")
    hist.axvline(100 * 2**-8, ls="--", color="gray", label="bound: $2^{-8}$ of the weight")
    hist.set(
        xlabel="|w(bfloat16) - w(float32)| / |w(float32)|  (%)",
        ylabel="weights",
        title=f"float32 to bfloat16: how far each of the {rounding.numel():,} weights moves",
    )
    hist.legend(loc="upper right")
    return fig

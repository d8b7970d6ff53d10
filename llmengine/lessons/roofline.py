"""Lessons 24 and 25's limits of a machine, and a decode step measured against them.

A decode step multiplies every position by every weight. With few rows, each weight read from
memory serves few multiplications, so the step can go no faster than the weights stream in:
its bound is the memory bandwidth over the bytes of weights. With many rows each weight
serves many, and the bound becomes the arithmetic rate. The roofline is the lower of the two
at each arithmetic intensity (FLOPs per byte of weight read); this module measures both
ceilings with PyTorch itself, counts a step's bytes and FLOPs, and draws the picture.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullLocator

from llmengine.lessons.step_cost import weights_multiplied
from llmengine.model.config import LlamaConfig

# Bytes one weight takes in each storage the engine offers (int8 also keeps one 2-byte scale
# per output channel, which is under 1% of a weight matrix and left out here).
BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2, "int8": 1}


def _fastest(run: Callable[[], object], repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth(working_set: int, repeats: int = 5) -> float:
    """Bytes per second a sum over `working_set` bytes of float32 reads, on torch's threads.

    Summed again and again, a working set that fits in the last-level cache is read from the
    cache; one far larger streams from DRAM on every pass.
    """
    data = torch.ones(working_set // 4)
    return data.numel() * 4 / _fastest(data.sum, repeats)


def memory_read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a sum over a float32 tensor far larger than any cache reads."""
    return read_bandwidth(megabytes * 2**20, repeats)


def matrix_product_rate(size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square float32 product large enough to keep the arithmetic units busy."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / _fastest(lambda: a @ b, repeats)


@dataclass(frozen=True)
class Ceilings:
    """This machine's two limits, measured: bytes per second and FLOP/s."""

    bandwidth: float
    flop_rate: float

    def attainable(self, intensity: float) -> float:
        """The roofline: FLOP/s a kernel of `intensity` FLOPs per byte can reach at most."""
        return min(self.flop_rate, self.bandwidth * intensity)

    @property
    def ridge(self) -> float:
        """The intensity where the two limits meet: below it memory bounds, above it arithmetic."""
        return self.flop_rate / self.bandwidth


def product_intensity(rows: int, bytes_per_weight: int) -> float:
    """FLOPs per byte of weight of a step's products: 2 per weight per row, over its bytes."""
    return 2 * rows / bytes_per_weight


def bytes_and_flops_rows(
    configs: Mapping[str, LlamaConfig], row_counts: Sequence[int]
) -> list[list[object]]:
    """Per model: the weight bytes a decode step reads in each storage, and the products'
    FLOPs and intensity at each row count (float32). The same on every machine."""
    rows = []
    for name, config in configs.items():
        weights = weights_multiplied(config)
        by_storage = [weights * size for size in BYTES_PER_WEIGHT.values()]
        for count in row_counts:
            flops = 2 * count * weights
            rows.append([name, count, *by_storage, flops, product_intensity(count, 4)])
    return rows


def plot_roofline(
    ceilings: Ceilings,
    measured: Mapping[str, Mapping[int, float]],
    bytes_per_weight: Mapping[str, int],
    title: str,
) -> plt.Figure:
    """The roofline with each version's measured product FLOP/s placed at its intensity.

    `measured[version][rows]` is FLOP/s; `bytes_per_weight[version]` places it on the x axis.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    lowest = min(product_intensity(min(r), bytes_per_weight[v]) for v, r in measured.items())
    highest = max(product_intensity(max(r), bytes_per_weight[v]) for v, r in measured.items())
    xs = [lowest / 2 * 1.25**step for step in range(64) if lowest / 2 * 1.25**step < highest * 4]
    ax.plot(xs, [ceilings.attainable(x) / 1e9 for x in xs], color="black", label="roofline")
    # One storage for every version: the rows go on a top axis once, not beside every point.
    shared = len(set(bytes_per_weight[version] for version in measured)) == 1
    for version, by_rows in measured.items():
        points = sorted(by_rows.items())
        intensity = [product_intensity(r, bytes_per_weight[version]) for r, _ in points]
        ax.plot(intensity, [rate / 1e9 for _, rate in points], "o-", label=version)
        if not shared:
            for (rows, rate), x in zip(points, intensity, strict=True):
                ax.annotate(str(rows), (x, rate / 1e9), textcoords="offset points", xytext=(3, 3))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("FLOPs per byte of weight" + ("" if shared else " (rows annotated)"))
    if shared:
        size = bytes_per_weight[next(iter(measured))]
        rows = sorted({r for by_rows in measured.values() for r in by_rows})
        top = ax.secondary_xaxis("top")
        top.set_xticks([product_intensity(r, size) for r in rows], [str(r) for r in rows])
        top.xaxis.set_minor_locator(NullLocator())
        top.set_xlabel("rows in the step")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return fig

"""Lesson 18's picture, swap against recompute: the sweep measured on a CPU beside the GPU cost
model of one preemption.

Three panels. Left, measured: each pool's forward positions under both preemption modes, with
the bytes swap moved instead. Centre, modelled: recompute seconds over swap seconds against the
context length, one curve per model and machine. Right, modelled: the crossover context
against model size. A model keeps its colour and a machine its line style and marker in both
modelled panels, and one legend below the figure names them all, so no legend covers a curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmengine.bench.batchbench import PoolResult
from llmengine.lessons.preemption_cost import (
    ACHIEVED_PREFILL_FRACTION,
    Gpu,
    PcieLink,
    crossover_context,
    parameter_count,
    recompute_seconds,
    swap_seconds,
)
from llmengine.model.config import LlamaConfig

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MODE_COLOURS = {"recompute": "#e6550d", "swap": "#3182bd"}
MODEL_PALETTE = ("#31a354", "#756bb1", "#636363")
MACHINE_LINES = ("-", "--", ":")
MACHINE_MARKERS = ("o", "s", "D")
NO_CROSSOVER_AT = 4e5  # where the right panel draws "no crossover", above every context
Machine = tuple[Gpu, PcieLink]


def machine_label(machine: Machine) -> str:
    gpu, link = machine
    return f"{gpu.name.removeprefix('NVIDIA ')} + {link.name}"


def draw_swap_against_recompute(
    by_mode: Mapping[str, Sequence[PoolResult]],
    pools: Sequence[int],
    models: Mapping[str, LlamaConfig],
    machines: Sequence[Machine],
    victim_contexts: Sequence[int],
) -> Figure:
    """The lesson's three panels; the victims' contexts are priced for the first model on the
    first machine (the embedded model on an H100 with PCIe 5.0 in the lesson)."""
    import matplotlib.pyplot as plt

    fig, (measured, ratio, cross) = plt.subplots(1, 3, figsize=(16, 6.4))
    _draw_measured(measured, by_mode, pools)
    colours = dict(zip(models, MODEL_PALETTE, strict=False))
    _draw_ratio(ratio, models, machines, colours, victim_contexts)
    _draw_crossover(cross, models, machines, colours)
    fig.legend(
        handles=_model_handles(colours, machines),
        loc="outside lower center",
        ncols=4,
        title="modelled panels: colour = model; line (centre) and marker (both) = machine",
    )
    fig.suptitle(
        "Swap against recompute: measured on this CPU (left), modelled for a GPU (centre, "
        f"right); prefill at {ACHIEVED_PREFILL_FRACTION:.0%} of dense bf16 peak, PCIe at rated "
        "bandwidth"
    )
    return fig


def _draw_measured(
    ax: Axes, by_mode: Mapping[str, Sequence[PoolResult]], pools: Sequence[int]
) -> None:
    once = by_mode["swap"][0].timing.total_forward_tokens
    x = range(len(pools))
    for offset, (mode, colour) in zip((-0.2, 0.2), MODE_COLOURS.items(), strict=True):
        positions = [result.timing.total_forward_tokens for result in by_mode[mode]]
        ax.bar([i + offset for i in x], positions, 0.38, color=colour, label=mode)
    for i, result in enumerate(by_mode["swap"]):
        moved = result.timing.bytes_swapped
        if moved:
            label = f"{moved / 2**10:,.0f}\nKiB"
            ax.text(i + 0.2, once + 6, label, ha="center", fontsize=9, color=MODE_COLOURS["swap"])
    ax.axhline(once, color="#333333", lw=0.8, ls="--", label=f"every position once: {once}")
    ax.set(
        xticks=list(x),
        xticklabels=[str(pool) for pool in pools],
        xlabel="pool (blocks)",
        ylabel="forward positions per run",
        ylim=(0, 300),
        title="measured on this CPU: positions computed,\nand KiB swap moved instead (blue)",
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3)


def _draw_ratio(
    ax: Axes,
    models: Mapping[str, LlamaConfig],
    machines: Sequence[Machine],
    colours: Mapping[str, str],
    victim_contexts: Sequence[int],
) -> None:
    lengths = [round(2 ** (e / 4)) for e in range(0, 4 * 17 + 1)]
    for name, config in models.items():
        for (gpu, link), line, marker in zip(
            machines, MACHINE_LINES, MACHINE_MARKERS, strict=False
        ):
            ratios = [
                recompute_seconds(config, n, gpu) / swap_seconds(config, n, link) for n in lengths
            ]
            ax.plot(lengths, ratios, line, color=colours[name], lw=1.5)
            crossover = crossover_context(config, gpu, link)
            if crossover is not None:
                ax.plot(crossover, 1.0, marker, color=colours[name], ms=6)
    config, (gpu, link) = next(iter(models.values())), machines[0]
    priced = [
        recompute_seconds(config, n, gpu) / swap_seconds(config, n, link) for n in victim_contexts
    ]
    label = (
        f"contexts of the 12-block run's victims (measured here),\n"
        f"priced for the {next(iter(models))} on {machine_label(machines[0])}"
    )
    ax.plot(victim_contexts, priced, "X", color="black", ms=7, ls="", label=label)
    ax.axhline(1.0, color="#333333", lw=0.8)
    ax.text(1.3, 1.15, "recompute dearer above 1, cheaper below", fontsize=9)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context length L at preemption (positions)",
        ylabel="recompute seconds / swap seconds",
        title="modelled: one preemption on a GPU, bf16",
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14))


def _draw_crossover(
    ax: Axes,
    models: Mapping[str, LlamaConfig],
    machines: Sequence[Machine],
    colours: Mapping[str, str],
) -> None:
    for name, config in models.items():
        size = parameter_count(config)
        longest = config.max_position_embeddings
        ax.plot(size, longest, "_", color=colours[name], ms=18, mew=2)
        for (gpu, link), marker in zip(machines, MACHINE_MARKERS, strict=False):
            crossover = crossover_context(config, gpu, link)
            at = NO_CROSSOVER_AT if crossover is None else crossover
            ax.plot(size, at, "^" if crossover is None else marker, color=colours[name], ms=8)
        if crossover_context(config, *machines[0]) is not None:
            ax.text(1.4 * size, 2.5e3, "recompute cheaper\nbelow its crossovers", fontsize=9)
    never = [
        parameter_count(config)
        for config in models.values()
        if crossover_context(config, *machines[0]) is None
    ]
    if never:  # one label for every model with no crossover, centred among them
        middle = math.prod(never) ** (1 / len(never))
        ax.text(middle, 1.5e4, "no crossover:\nswap cheaper at every L", ha="center", fontsize=9)
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(1e6, 3e10),
        ylim=(100, 1.5 * NO_CROSSOVER_AT),
        xlabel="parameters",
        ylabel="context length L (positions)",
        title="modelled: crossover context against model size",
    )


def _model_handles(colours: Mapping[str, str], machines: Sequence[Machine]) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grey = "#555555"
    handles: list = [Patch(color=colour, label=name) for name, colour in colours.items()]
    handles += [
        Line2D([], [], color=grey, ls=line, marker=marker, label=machine_label(machine))
        for machine, line, marker in zip(machines, MACHINE_LINES, MACHINE_MARKERS, strict=False)
    ]
    handles += [
        Line2D([], [], marker="^", color=grey, ls="", label="no crossover: swap always cheaper"),
        Line2D([], [], marker="_", color=grey, ls="", ms=14, mew=2, label="longest context held"),
    ]
    return handles

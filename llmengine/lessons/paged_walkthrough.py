"""A paged KV cache driven by hand: add sequences, decode them, finish them, watch the pool.

The engine's scheduler decides when sequences start and stop; here the caller does, so a
lesson can stage a story (three sequences grow, one finishes, a newcomer reuses its blocks)
and look at the block tables after every forward. Each step is the real thing: blocks come
from a `BlockPool`, positions are recorded in `BlockTable`s, the forward is `paged_forward`,
and every logit row is checked against the model run without any cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llmengine.kv.blocks import BlockPool, BlockTable, blocks_for_length
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.runner.attention import PagedRow
from llmengine.runner.forward import paged_forward

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The live sequences' block tables and cached lengths at one moment."""

    label: str
    tables: dict[str, tuple[int, ...]]
    lengths: dict[str, int]

    def owners(self) -> dict[int, tuple[str, int]]:
        """Block id to (the sequence holding it, the block's index in that sequence's table)."""
        return {
            block: (name, index)
            for name, table in self.tables.items()
            for index, block in enumerate(table)
        }


class PagedWalkthrough:
    """Sequences sharing one `PagedKVCache`, moved by explicit `add`, `decode` and `finish`.

    Greedy decoding. `max_abs_error` is the largest difference seen so far between a paged
    logit and the same logit computed with no cache over the whole sequence, over
    `rows_checked` logit rows in `forwards` forwards.
    """

    def __init__(self, model: Llama, num_blocks: int, block_size: int) -> None:
        parameter = next(model.parameters())
        self.model = model
        self.pool = BlockPool(num_blocks)
        self.cache = PagedKVCache(
            model.config, num_blocks, block_size, dtype=parameter.dtype, device=parameter.device
        )
        self.tokens: dict[str, list[int]] = {}
        self.tables: dict[str, BlockTable] = {}
        self.snapshots: list[PoolSnapshot] = []
        self.max_abs_error = 0.0
        self.forwards = 0
        self.rows_checked = 0

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def add(self, name: str, prompt_ids: Sequence[int]) -> None:
        """Prefill a new sequence in its own forward; it then holds its first generated token."""
        if name in self.tables:
            raise ValueError(f"a live sequence is already called {name!r}")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        self.tokens[name] = list(prompt_ids)
        self.tables[name] = BlockTable(self.block_size)
        self._forward([name], f"prefill {name}")

    def decode(self, steps: int = 1) -> None:
        """Run `steps` forwards, each computing one position for every live sequence."""
        for _ in range(steps):
            self._forward(list(self.tables), "decode")

    def finish(self, name: str) -> list[int]:
        """Stop a sequence and give its blocks back to the pool; returns the freed ids."""
        freed = self.tables.pop(name).release()
        self.pool.free(freed)
        self._snapshot(f"finish {name}")
        return freed

    def _forward(self, names: list[str], label: str) -> None:
        rows = []
        for name in names:
            table, tokens = self.tables[name], self.tokens[name]
            needed = blocks_for_length(len(tokens), self.block_size) - len(table.block_ids)
            table.extend(self.pool.allocate(needed))
            rows.append(PagedRow(tokens[table.num_tokens :], table.num_tokens, table.block_ids))
        with torch.inference_mode():
            logits = paged_forward(self.model, self.cache, rows)
            for name, row, row_logits in zip(names, rows, logits, strict=True):
                self.tables[name].append(len(row.token_ids))
                reference = self.model(torch.tensor([self.tokens[name]], device=logits.device))
                error = (row_logits - reference[0, -1]).abs().max().item()
                self.max_abs_error = max(self.max_abs_error, error)
                self.tokens[name].append(int(row_logits.argmax()))
        self.forwards += 1
        self.rows_checked += len(rows)
        self._snapshot(label)

    def _snapshot(self, label: str) -> None:
        self.snapshots.append(
            PoolSnapshot(
                label,
                {name: tuple(table.block_ids) for name, table in self.tables.items()},
                {name: table.num_tokens for name, table in self.tables.items()},
            )
        )


def _colors(walk: PagedWalkthrough) -> dict[str, tuple[float, float, float, float]]:
    """One colour per sequence, in the order the sequences were added, the same in every plot."""
    import matplotlib

    palette = matplotlib.colormaps["tab10"]
    return {name: palette(index % 10) for index, name in enumerate(walk.tokens)}


def _shade(snapshot: PoolSnapshot, name: str, index: int, block_size: int) -> float:
    """Opacity of a sequence's `index`-th block: darker the more of its positions hold K/V."""
    filled = min(block_size, max(0, snapshot.lengths[name] - index * block_size))
    return 0.25 + 0.6 * filled / block_size


def plot_tables_and_pool(walk: PagedWalkthrough, snapshot: PoolSnapshot | None = None) -> Figure:
    """Two views of one moment (default: the last): the block tables, and the pool they index.

    Above, each sequence's table: logical block i to a physical block id. Below, the pool:
    who holds each physical block, and as which of its blocks.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    snapshot = snapshot or walk.snapshots[-1]
    colors, size, names = _colors(walk), walk.block_size, sorted(snapshot.tables)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8.0, 4.8), height_ratios=[len(names), 1.6], layout="constrained"
    )
    for row, name in enumerate(names):
        for index, block in enumerate(snapshot.tables[name]):
            alpha = _shade(snapshot, name, index, size)
            top.add_patch(
                Rectangle((index, -row - 1), 1, 1, fc=colors[name], alpha=alpha, ec="black")
            )
            top.text(index + 0.5, -row - 0.5, str(block), ha="center", va="center")
    width = max(len(table) for table in snapshot.tables.values())
    top.set(xlim=(0, width), ylim=(-len(names), 0), xlabel="index in the block table")
    top.set_xticks([index + 0.5 for index in range(width)], range(width))
    top.set_yticks([-row - 0.5 for row in range(len(names))], names)
    top.set_title("block tables: logical block i of a sequence -> physical block id")
    owners = snapshot.owners()
    for block in range(walk.pool.num_blocks):
        face, alpha, text = "white", 1.0, ""
        if block in owners:
            name, index = owners[block]
            face, alpha, text = colors[name], _shade(snapshot, name, index, size), f"{name}{index}"
        bottom.add_patch(Rectangle((block, 0), 1, 1, fc=face, alpha=alpha, ec="black"))
        bottom.text(block + 0.5, 0.5, text, ha="center", va="center", fontsize=8)
    bottom.set(xlim=(0, walk.pool.num_blocks), ylim=(0, 1), xlabel="physical block id")
    bottom.set_xticks(
        [block + 0.5 for block in range(walk.pool.num_blocks)], range(walk.pool.num_blocks)
    )
    bottom.set_yticks([])
    bottom.set_title("the pool: which sequence, and which of its blocks, each block holds")
    for axis in (top, bottom):
        axis.grid(False)
    return fig


def plot_pool_history(walk: PagedWalkthrough) -> Figure:
    """The pool after every step, one row per snapshot: who holds each block, and how full."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    colors, snapshots, num_blocks = _colors(walk), walk.snapshots, walk.pool.num_blocks
    fig, axis = plt.subplots(figsize=(8.0, 0.28 * len(snapshots) + 1.4), layout="constrained")
    for row, snapshot in enumerate(snapshots):
        for block, (name, index) in snapshot.owners().items():
            alpha = _shade(snapshot, name, index, walk.block_size)
            axis.add_patch(Rectangle((block, -row - 1), 1, 1, fc=colors[name], alpha=alpha))
    axis.set(xlim=(0, num_blocks), ylim=(-len(snapshots), 0), xlabel="physical block id")
    axis.set_xticks([block + 0.5 for block in range(num_blocks)], range(num_blocks))
    axis.set_yticks([-row - 0.5 for row in range(len(snapshots))], [s.label for s in snapshots])
    axis.grid(False)
    axis.legend(
        handles=[Patch(fc=color, label=name) for name, color in colors.items()],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    axis.set_title("the pool over time (white = free, darker = fuller block)")
    return fig

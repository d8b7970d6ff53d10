"""Lesson 26's helpers: one layer's split drawn, the shards against the whole, the timings of
a tensor-parallel step, and a cost model of all-reduces on fast interconnects.

The timing functions are those of `scripts/bench_tensor_parallel.py`, importable so that a
lesson's spawned processes can find them: a decode step's mean time on an engine, the
parameter bytes one rank holds, and one all-reduce timed alone between two processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors import safe_open

import llmengine
from llmengine.model.config import LlamaConfig
from llmengine.model.sharding import COLUMN, ROW, Shard, check_divisible, read_shard, split_dim
from llmengine.parallel.cluster import Cluster

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PROMPT = list(range(3, 19))
PROJECTIONS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)
RANK_COLOURS = ("#4c78a8", "#f58518")


def projection_shapes(config: LlamaConfig, world: int) -> list[tuple[str, tuple[int, int]]]:
    """Each projection of one layer and its whole weight's shape, [out, in], from `config`."""
    check_divisible(config, world)
    hidden, head_dim = config.hidden_size, config.head_dim
    shapes = {
        "q_proj": (config.num_attention_heads * head_dim, hidden),
        "k_proj": (config.num_key_value_heads * head_dim, hidden),
        "v_proj": (config.num_key_value_heads * head_dim, hidden),
        "o_proj": (hidden, config.num_attention_heads * head_dim),
        "gate_proj": (config.intermediate_size, hidden),
        "up_proj": (config.intermediate_size, hidden),
        "down_proj": (hidden, config.intermediate_size),
    }
    return [(name, shapes[name]) for _, name in PROJECTIONS]


def plot_split(config: LlamaConfig, world: int = 2) -> Figure:
    """One layer's seven weights as rectangles ([out, in], to scale), each cut among `world`
    ranks: by rows (output) for Q, K, V, gate and up, by columns (input) for o_proj and down,
    with a marker where each block's all-reduce sums the ranks' partial outputs."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    unit = config.hidden_size
    x, gap, top = 0.0, 0.45, 0.0
    reduces: list[float] = []
    colours = [RANK_COLOURS[rank % 2] if world <= 2 else None for rank in range(world)]
    cmap = plt.get_cmap("tab10")
    for name, (out, inp) in projection_shapes(config, world):
        height, width = out / unit, inp / unit
        for rank in range(world):
            colour = colours[rank] or cmap(rank)
            if name in COLUMN:  # rows: rank r holds output rows [r/world, (r+1)/world)
                box = (x, height / 2 - (rank + 1) * height / world, width, height / world)
            else:  # columns: rank r holds input columns
                box = (x + rank * width / world, -height / 2, width / world, height)
            ax.add_patch(Rectangle(box[:2], box[2], box[3], facecolor=colour, alpha=0.8,
                                   edgecolor="white", linewidth=1.5))  # fmt: skip
        ax.text(x + width / 2, height / 2 + 0.12, f"{name}\n{out}x{inp}", ha="center",
                va="bottom", fontsize=8)  # fmt: skip
        top = max(top, height / 2 + 0.6)
        x += width + gap
        if name in ROW:
            reduces.append(x - gap / 2)
            x += gap
    for where, block in zip(reduces, ("attention", "MLP"), strict=True):
        ax.axvline(where, color="#c03030", linestyle="--", linewidth=1.5)
        ax.text(where, -top, f"all-reduce\n({block})", color="#c03030", ha="center",
                va="top", fontsize=9, fontweight="bold")  # fmt: skip
    ax.set_xlim(-0.2, x)
    ax.set_ylim(-top - 0.7, top + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    handles = [Patch(color=colours[r] or cmap(r), label=f"rank {r}") for r in range(world)]
    ax.legend(handles=handles, loc="lower left", ncols=world, frameon=False)
    ax.set_title(
        f"One layer at {world} ranks: Q, K, V, gate, up cut by rows; o_proj, down by columns"
    )
    return fig


def shape_rows(whole: torch.nn.Module, part: torch.nn.Module, world: int) -> list[list]:
    """One row per projection of layer 0: its whole shape, rank 0's, the dimension cut and
    whether rank 0's is the whole with that dimension divided by `world`."""
    rows = []
    for block, name in PROJECTIONS:
        full = tuple(getattr(getattr(whole.layers[0], block), name).weight.shape)
        mine = tuple(getattr(getattr(part.layers[0], block), name).weight.shape)
        dim = split_dim(f"model.layers.0.{block}.{name}.weight")
        expected = tuple(size // world if axis == dim else size for axis, size in enumerate(full))
        cut = {0: "rows (output)", 1: "columns (input)"}[dim]
        rows.append(
            [name, str(list(full)), str(list(mine)), cut, "yes" if mine == expected else "no"]
        )
    return rows


@dataclass(frozen=True, slots=True)
class SliceCheck:
    """What `slices_make_the_whole` found over every tensor of a checkpoint."""

    tensors: int
    split: int
    whole_on_every_rank: int
    equal: int


def slices_make_the_whole(path: Path, world: int = 2) -> SliceCheck:
    """Read every tensor of `path/model.safetensors` as each of `world` ranks does and compare
    the ranks' slices, joined along the split dimension, with the whole tensor."""
    split = kept = equal = 0
    with safe_open(Path(path) / "model.safetensors", framework="pt") as handle:
        names = sorted(handle.keys())
        for name in names:
            parts = [read_shard(handle, name, Shard(rank, world)) for rank in range(world)]
            whole = handle.get_tensor(name)
            dim = split_dim(name)
            if dim is None:
                kept += 1
                same = all(torch.equal(part, whole) for part in parts)
            else:
                split += 1
                same = torch.equal(torch.cat(parts, dim=dim), whole)
            equal += same
    return SliceCheck(len(names), split, kept, equal)


def decode_step_ms(engine: llmengine.Engine, rows: int, steps: int) -> float:
    """Mean ms of a decode step with `rows` requests running (their prefill excluded)."""
    params = llmengine.SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    engine.add_requests([PROMPT] * rows, params)
    engine.step()  # the prefills
    engine.step()  # one decode to warm up
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = (time.perf_counter() - start) / steps * 1e3
    while engine.has_unfinished():
        engine.step()
    return elapsed


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters `model` holds (one rank's, for a sharded model)."""
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def _all_reduce_us(
    rank: int, port: int, shapes: list[tuple[int, int]], repeats: int, out: mp.Queue
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    torch.set_num_threads(1)
    results = []
    for shape in shapes:
        tensor = torch.ones(shape)
        for _ in range(5):
            dist.all_reduce(tensor)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(tensor)
        results.append((time.perf_counter() - start) / repeats * 1e6)
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def time_all_reduces(shapes: list[tuple[int, int]], repeats: int = 200) -> list[float]:
    """Microseconds of one all-reduce of each `shape` float32 tensor between two processes
    (gloo over 127.0.0.1), timed alone: no model, no broadcast, nothing else running."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = Cluster(2).with_port().master_port
    ranks = [
        context.Process(target=_all_reduce_us, args=(rank, port, shapes, repeats, queue))
        for rank in (0, 1)
    ]
    for process in ranks:
        process.start()
    try:
        return queue.get(timeout=120)
    finally:
        for process in ranks:
            process.join(60)
            if process.is_alive():
                process.kill()


def all_reduces_per_decode_step(config: LlamaConfig) -> int:
    """The all-reduces one forward makes on every rank: one after attention and one after the
    MLP, in every layer (whatever the number of rows)."""
    return 2 * config.num_hidden_layers


def llama_parameters(config: LlamaConfig) -> int:
    """The parameter count of a Llama of this shape (embedding, layers, norm, head)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attention = hidden * head_dim * (2 * config.num_attention_heads
                                     + 2 * config.num_key_value_heads)  # fmt: skip
    mlp = 3 * hidden * config.intermediate_size
    layer = attention + mlp + 2 * hidden
    head = 0 if config.tie_word_embeddings else config.vocab_size * hidden
    return config.vocab_size * hidden + config.num_hidden_layers * layer + hidden + head


def llama3(hidden: int, layers: int, intermediate: int, heads: int) -> LlamaConfig:
    """A Llama 3 shape: 8 K/V heads, head dim 128, a 128,256-token vocabulary, untied head."""
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
    )


LLAMA3_8B = llama3(4096, 32, 14336, 32)
LLAMA3_70B = llama3(8192, 80, 28672, 64)


def ring_all_reduce_seconds(
    payload_bytes: float, ranks: int, bandwidth_bytes_s: float, latency_s: float = 0.0
) -> float:
    """A ring all-reduce, modelled: each rank sends 2 (n - 1) / n of the payload (a
    reduce-scatter, then an all-gather) over a link of `bandwidth_bytes_s` per direction, plus
    2 (n - 1) hops of `latency_s`. A model, not a measurement."""
    if ranks < 2:
        return 0.0
    share = 2 * (ranks - 1) / ranks
    return share * payload_bytes / bandwidth_bytes_s + 2 * (ranks - 1) * latency_s


def rank_parameters(config: LlamaConfig, world: int) -> int:
    """The parameters one of `world` ranks holds under this engine's split: every layer's
    projections divided among the ranks, the embedding, head and norms whole on each."""
    whole = llama_parameters(config)
    projections = sum(out * inp for _, (out, inp) in projection_shapes(config, 1))
    return whole - config.num_hidden_layers * projections * (world - 1) // world


def rank_weights_read(config: LlamaConfig, world: int) -> int:
    """The weights one rank multiplies by in a decode step: its share of every layer's
    projections, and the whole output head (the embedding is looked up, not multiplied)."""
    projections = sum(out * inp for _, (out, inp) in projection_shapes(config, world))
    return config.num_hidden_layers * projections // world + config.vocab_size * config.hidden_size

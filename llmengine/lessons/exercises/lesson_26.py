"""Lesson 26's exercises: the split of the embedded model across ranks.

Nothing here is timed and no process is started. The checkers ask the engine's own code: the
parameters and weights `load_model` reads for rank 0, and the sizes `check_divisible` accepts.
"""

from __future__ import annotations

import contextlib

import llmengine
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.model.config import LlamaConfig
from llmengine.model.sharding import Shard, check_divisible


def _config() -> LlamaConfig:
    return LlamaConfig.from_file(llmengine.embedded_model_path() / "config.json")


def vocab_parallel_bytes(world: int = 2) -> int:
    """The parameter bytes rank 0 of `world` would hold if the embedding (tied to the output
    head) were cut by vocabulary rows too: what `load_model` reads for rank 0, less all but its
    share of the embedding."""
    model = llmengine.load_model(kernels="eager", shard=Shard(0, world))
    embedding = model.embed_tokens.weight
    held = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    return held - embedding.numel() * embedding.element_size() * (world - 1) // world


def check_vocab_parallel_bytes(answer: int | None, world: int = 2) -> Verdict:
    """Exercise 1: rank 0's parameter bytes with the embedding cut by vocabulary rows."""
    if answer is None:
        return check_value(None, None, what="rank 0's parameter bytes")
    return check_value(
        answer,
        vocab_parallel_bytes(world),
        what=f"rank 0's parameter bytes at {world} ranks with a vocabulary-parallel embedding",
        explain="The memory table's bytes at that many ranks, less the embedding's share the "
        "other ranks would hold: vocabulary x hidden x 4 bytes x (ranks - 1) / ranks.",
    )


def rank_zero_shape(projection: str, world: int) -> tuple[int, int]:
    """The shape of layer 0's `projection` weight (`down_proj`, `k_proj`...) as rank 0 of
    `world` loads it."""
    model = llmengine.load_model(kernels="eager", shard=Shard(0, world))
    layer = model.layers[0]
    block = layer.mlp if hasattr(layer.mlp, projection) else layer.self_attn
    return tuple(getattr(block, projection).weight.shape)


def check_down_proj_shape(answer: tuple[int, int] | list[int] | None, world: int = 4) -> Verdict:
    """Exercise 2: rank 0's down_proj weight shape, [out, in], at `world` ranks."""
    if answer is None:
        return check_value(None, None, what="rank 0's down_proj shape")
    return check_value(
        tuple(answer),
        rank_zero_shape("down_proj", world),
        what=f"rank 0's down_proj weight shape at {world} ranks",
        explain="down is cut by input columns: each rank multiplies its part of the MLP's "
        "hidden units into the whole hidden size, a partial sum the all-reduce completes.",
    )


def largest_tensor_parallel_size(config: LlamaConfig | None = None) -> int:
    """The largest number of ranks `check_divisible` accepts for `config` (the embedded
    model's by default)."""
    config = config or _config()
    accepted = 1
    for world in range(1, config.num_attention_heads + 1):
        with contextlib.suppress(ValueError):
            check_divisible(config, world)
            accepted = world
    return accepted


def check_largest_size(answer: int | None) -> Verdict:
    """Exercise 3: the largest tensor_parallel_size the embedded model accepts."""
    if answer is None:
        return check_value(None, None, what="the largest tensor_parallel_size")
    return check_value(
        answer,
        largest_tensor_parallel_size(),
        what="the largest tensor_parallel_size the embedded model accepts",
        explain="It must divide the heads, the K/V heads and the MLP width: their greatest "
        "common divisor.",
    )

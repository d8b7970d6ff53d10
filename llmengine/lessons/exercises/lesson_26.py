"""Lesson 26's exercises: the split of the embedded model across ranks.

Nothing here is timed and no process is started. The checkers ask the engine's own code:
the all-reduce hooks `add_all_reduces` puts on a rank's model, the weight `load_model` reads
for rank 0, and the sizes `check_divisible` accepts.
"""

from __future__ import annotations

import contextlib

import llmengine
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.model.config import LlamaConfig
from llmengine.model.sharding import Shard, check_divisible
from llmengine.parallel.engine import add_all_reduces


def _config() -> LlamaConfig:
    return LlamaConfig.from_file(llmengine.embedded_model_path() / "config.json")


def all_reduces_per_step(world: int = 2) -> int:
    """The all-reduces one forward of a rank makes: the hooks `add_all_reduces` registers on
    rank 0's model (each runs once per forward, whatever the number of rows)."""
    model = llmengine.load_model(kernels="eager", shard=Shard(0, world))
    add_all_reduces(model)
    return sum(len(module._forward_hooks) for module in model.modules())


def check_all_reduces(answer: int | None, world: int = 2) -> Verdict:
    """Exercise 1: how many all-reduces a decode step of the embedded model makes."""
    if answer is None:
        return check_value(None, None, what="the all-reduces of a decode step")
    return check_value(
        answer,
        all_reduces_per_step(world),
        what=f"the all-reduces of one decode step at {world} ranks",
        explain="One after attention's o_proj and one after the MLP's down, in every layer.",
    )


def rank_zero_k_proj_shape(world: int = 2) -> tuple[int, int]:
    """The shape of layer 0's k_proj weight as rank 0 of `world` loads it."""
    model = llmengine.load_model(kernels="eager", shard=Shard(0, world))
    return tuple(model.layers[0].self_attn.k_proj.weight.shape)


def check_k_proj_shape(answer: tuple[int, int] | list[int] | None, world: int = 2) -> Verdict:
    """Exercise 2: rank 0's k_proj weight shape, [out, in], at `world` ranks."""
    if answer is None:
        return check_value(None, None, what="rank 0's k_proj shape")
    return check_value(
        tuple(answer),
        rank_zero_k_proj_shape(world),
        what=f"rank 0's k_proj weight shape at {world} ranks",
        explain="K is cut by output rows: whole K/V heads per rank, the whole hidden input.",
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

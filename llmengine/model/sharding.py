"""Which slice of each weight a rank holds, Megatron-style, and the config of one rank's model.

- Column parallel (split by output, dim 0): `q_proj`, `k_proj`, `v_proj`, `gate_proj` and
  `up_proj`, weights and biases. Each rank computes its own heads and its own part of the MLP's
  hidden layer from the whole input, with no communication.
- Row parallel (split by input, dim 1): `o_proj` and `down_proj`. Each rank multiplies its part
  of the input by its part of the weight; the ranks' partial outputs sum to the whole product,
  which is the one all-reduce per block. A bias is added once, by rank 0.
- Kept whole on every rank: the embedding, the head and the norms (small next to the layers
  on the models this engine runs; every rank then samples from the same logits).

A rank's model is a plain `Llama` built from `local_config`: a fraction of the heads, K/V
heads and MLP width, the same `head_dim` and hidden size, so the model code does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from llmengine.model.config import LlamaConfig

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Shard:
    """This process's place: rank `rank` of `world` ranks."""

    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {self.rank}")


def check_divisible(config: LlamaConfig, world: int) -> None:
    """Refuse a split the model's shape does not allow, naming the dimension."""
    if world < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {world}")
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(config, name) % world:
            raise ValueError(
                f"tensor_parallel_size={world} does not divide {name}="
                f"{getattr(config, name)}: every rank must hold whole heads and an equal part "
                "of the MLP"
            )


def local_config(config: LlamaConfig, world: int) -> LlamaConfig:
    """The configuration of one rank's slice of the model."""
    check_divisible(config, world)
    return replace(
        config,
        num_attention_heads=config.num_attention_heads // world,
        num_key_value_heads=config.num_key_value_heads // world,
        intermediate_size=config.intermediate_size // world,
    )


def _module_and_kind(checkpoint_name: str) -> tuple[str, str]:
    """`("o_proj", "bias")` for `model.layers.0.self_attn.o_proj.bias`."""
    path, _, kind = checkpoint_name.rpartition(".")
    return path.rpartition(".")[2], kind


def split_dim(checkpoint_name: str) -> int | None:
    """The dimension a tensor is split along (None: every rank reads it whole)."""
    module, kind = _module_and_kind(checkpoint_name)
    if module in COLUMN:
        return 0
    if module in ROW and kind == "weight":
        return 1
    return None


def read_shard(handle: object, name: str, shard: Shard) -> torch.Tensor:
    """Read only this rank's slice of tensor `name` from an open safetensors file.

    A row-parallel bias is whole on rank 0 and zero on the others, so the all-reduce adds it
    once.
    """
    dim = split_dim(name)
    if dim is None:
        tensor = handle.get_tensor(name)
        row_parallel_bias = _module_and_kind(name)[0] in ROW
        return torch.zeros_like(tensor) if shard.rank and row_parallel_bias else tensor
    view = handle.get_slice(name)
    size = view.get_shape()[dim] // shard.world
    start = shard.rank * size
    return view[start : start + size] if dim == 0 else view[:, start : start + size]

"""`load_model`: a checkpoint read, then prepared for speed, as every engine runs it.

Reading (`llmengine.model.loader.load_checkpoint`) gives the plain `Llama` lesson 01 builds;
preparing (`llmengine.speed.prepare.prepare_for_speed`) fuses its projections and picks each
product's kernel for this machine, without changing what it computes. Both happen here, at
the model runner's door, so that `llmengine.model` needs nothing above it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from llmengine.model.loader import load_checkpoint, resolve_device
from llmengine.model.sharding import Shard
from llmengine.speed.prepare import PreparedLlama, prepare_for_speed
from llmengine.speed.projections import check_preparation


def load_model(
    path: str | Path | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    kernels: str = "measured",
    quantization: str | None = None,
    shard: Shard | None = None,
) -> PreparedLlama:
    """Load a Llama checkpoint folder (the embedded model when `path` is None), in eval mode
    with gradients off, prepared for speed: projections fused, and each product's kernel
    chosen for each row count (`"measured"` on this machine, the default; `"packed"`, MKL's
    packed copy for 4 to 48 rows without measuring; `"eager"`, plain `F.linear`).
    `quantization="int8"` multiplies by int8 copies of the weights instead (weight-only, one
    scale per output channel; CPU only: `llmengine.speed.quantization`).

    `dtype`, `device` and `shard` are `load_checkpoint`'s: the weights' dtype (None:
    float32; "auto": the checkpoint's own), where they go (a device this machine lacks is a
    ValueError before anything is read), and one rank's slice for tensor parallelism.
    """
    check_preparation(kernels, quantization)
    if quantization is not None and resolve_device(device).type != "cpu":
        raise ValueError(f"{quantization} quantization runs on the CPU only, not {device}")
    model = load_checkpoint(path, dtype=dtype, device=device, shard=shard)
    return prepare_for_speed(model, kernels, quantization)

"""Rotary position embeddings: a token's position is a rotation of its query and key.

Each pair of channels (i, i + head_dim/2) is rotated by the angle `position * inv_freq[i]`.
Because the dot product of two rotated vectors depends only on the difference of their
angles, attention scores see relative positions. The positions are passed in explicitly,
so a row may start anywhere: that is what lets a cache compute only the new positions.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmengine.model.config import Llama3RopeScaling, LlamaConfig


def inverse_frequencies(config: LlamaConfig, device: torch.device | None = None) -> torch.Tensor:
    """One angular frequency per channel pair, `[head_dim / 2]`, float32."""
    exponents = torch.arange(0, config.head_dim, 2, device=device, dtype=torch.float32)
    inv_freq = 1.0 / (config.rope_theta ** (exponents / config.head_dim))
    if config.rope_scaling is None:
        return inv_freq
    return llama3_scaled(inv_freq, config.rope_scaling)


def llama3_scaled(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Stretch the slow frequencies so a model trained on short context reaches further.

    Fast frequencies (short wavelengths) are kept, slow ones are divided by `factor`,
    and the band in between is blended linearly in `context / wavelength`.
    """
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    fast = wavelength < context / scaling.high_freq_factor
    slow = wavelength > context / scaling.low_freq_factor
    blend = (context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    between = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
    return torch.where(fast, inv_freq, torch.where(slow, inv_freq / scaling.factor, between))


class RotaryEmbedding(nn.Module):
    """Turns positions `[B, S]` into the cosines and sines `[B, S, head_dim]` of their angles.

    It holds no buffer: the frequencies are recomputed per call (a few dozen numbers), so
    they stay float32 whatever dtype or device the model is moved to.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = inverse_frequencies(self.config, device=positions.device)
        angles = positions.float()[..., None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[B, S, heads, head_dim]` by the angles whose cos/sin are `[B, S, head_dim]`."""
    cos = cos[:, :, None, :].to(x.dtype)
    sin = sin[:, :, None, :].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat((-second, first), dim=-1)
    return x * cos + rotated_half * sin

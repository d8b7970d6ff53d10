"""Weight-only int8: each weight stored as int8 with one scale per output channel.

A decode step of a few rows reads every weight once and does little arithmetic with it, so
its time is the weights' bytes over the memory bandwidth: a quarter of float32's bytes could
make it up to four times faster. Only the weights are quantised; activations, the KV cache
and every sum stay in the model's dtype. Per output channel, `w[o, :] ~= q[o, :] * scale[o]`
with `scale[o] = max |w[o, :]| / 127` (symmetric, no zero point), the scheme PyTorch's CPU
kernel `aten._weight_int8pack_mm` computes with. What it costs in accuracy, and whether that
kernel is faster than the float ones on a given CPU, are measured, not assumed (lesson 24).
"""

from __future__ import annotations

import torch

QUANTIZATIONS = ("int8",)


class Int8Weight:
    """A weight `[out, in]` quantised to int8 per output channel; `linear` multiplies by it.

    Products run in the activations' dtype (the scales are kept in it), through
    `aten._weight_int8pack_mm`, which takes a 2-D input and no bias.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(
                f"int8 quantises a 2-D float weight, not {weight.dtype} {weight.shape}"
            )
        # Computed in float32 whatever the weight's dtype, so a bfloat16 weight's scales are
        # not rounded twice.
        wide = weight.float()
        scales = wide.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.values = (wide / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.scales = scales.to(weight.dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight the int8 values stand for, in the scales' dtype."""
        return self.values.to(self.scales.dtype) * self.scales[:, None]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, dequantized(), bias)` for `x` `[..., in]` in the scales' dtype."""
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.aten._weight_int8pack_mm(rows, self.values, self.scales)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])

"""Weight-only int8: each weight stored as int8 with one scale per output channel.

A decode step of a few rows reads every weight once and does little arithmetic with it, so
its time is the weights' bytes over the memory bandwidth: a quarter of float32's bytes could
make it up to four times faster. Only the weights are quantised; the activations between the
products, the KV cache and every sum stay in the model's dtype. Per output channel,
`w[o, :] ~= q[o, :] * scale[o]` with `scale[o] = max |w[o, :]| / 127` (symmetric, no zero
point), the scheme PyTorch's CPU kernel `aten._weight_int8pack_mm` computes with. What it
costs in accuracy, and whether that kernel is faster than the float ones on a given CPU, are
measured, not assumed (lesson 24).
"""

from __future__ import annotations

import torch

QUANTIZATIONS = ("int8",)
PRODUCT_DTYPE = torch.bfloat16


class Int8Weight:
    """A weight `[out, in]` quantised to int8 per output channel; `linear` multiplies by it.

    Products go through `aten._weight_int8pack_mm` (a 2-D input, no bias) in bfloat16: its
    CPU kernel is vectorised for 16-bit inputs and falls back to a scalar loop for float32,
    measured 30 to 60 times slower on an AMD EPYC (Zen 4). Float32 activations are rounded to
    bfloat16 for the product and its result widened back, so the int8 weight's 8 bits, not
    the activations', bound the product's precision.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(
                f"int8 quantises a 2-D float weight, not {weight.dtype} {weight.shape}"
            )
        # Computed in float32 whatever the weight's dtype, so a bfloat16 weight's scales are
        # not rounded twice.
        wide = weight.float()
        largest = wide.abs().amax(dim=1).clamp(min=torch.finfo(PRODUCT_DTYPE).tiny)
        # Scales are rounded to the product's dtype first and the values fitted to the scales
        # as rounded, so each value is within half a step of the weight it stands for.
        self.scales = (largest / 127).to(PRODUCT_DTYPE)
        steps = self.scales.float()[:, None]
        self.values = (wide / steps).round().clamp(-127, 127).to(torch.int8)
        self.dtype = weight.dtype

    def dequantized(self) -> torch.Tensor:
        """The weight the int8 values stand for, in the weight's dtype."""
        return (self.values.float() * self.scales.float()[:, None]).to(self.dtype)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """About `F.linear(x, dequantized(), bias)` for `x` `[..., in]`, in `x`'s dtype."""
        rows = x.reshape(-1, x.shape[-1]).to(PRODUCT_DTYPE)
        out = torch.ops.aten._weight_int8pack_mm(rows, self.values, self.scales).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])

"""A matrix product prepared once, at load, so that each step pays only for the product.

`Product` computes `F.linear(x, weight, bias)` through the kernel prepared for its weight
(`llmengine.speed.kernels`): the fastest for each row count as measured on this machine
(`"measured"`, what `load_model` does), MKL's packed copy for 4 to 48 rows by a fixed rule
(`"packed"`, lesson 23), or plain `F.linear` (`"eager"`); or, with `quantization="int8"`,
through an int8 copy of the weight (`llmengine.speed.quantization`), whatever the kernels. An eager
`F.linear` hands MKL the plain weight, which MKL repacks on every call; a prepared kernel reads
a copy laid out once for it, which costs the weight's memory again.

`fuse` makes one product of linear layers that read the same input (Q, K and V; gate and up):
their weights concatenated, one operator instead of three, one pass over the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from llmengine.speed.kernels import (
    ChosenKernels,
    KernelMeasurement,
    can_pack,
    candidates_for,
    measure_kernels,
    packed_choice,
)
from llmengine.speed.quantization import QUANTIZATIONS, Int8Weight

PREPARATIONS = ("measured", "packed", "eager")


def check_preparation(kernels: str, quantization: str | None) -> None:
    """ValueError unless `kernels` is one of `PREPARATIONS` and `quantization` None or one of
    `QUANTIZATIONS` (`load_model` checks before it reads a weight)."""
    if kernels not in PREPARATIONS:
        raise ValueError(f"kernels must be one of {PREPARATIONS}, not {kernels!r}")
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, not {quantization!r}")


def stack(layers: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight matrix (and bias) for `layers`, their rows stacked in order, in new memory."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return weight, bias


def fuse(layers: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`stack(layers)`, after which every layer's parameters are views of their rows: the
    layers keep their names and share the stacked matrix's memory, no weight stored twice."""
    weight, bias = stack(layers)
    start = 0
    for layer in layers:
        rows = slice(start, start + layer.out_features)
        layer.weight = nn.Parameter(weight[rows], requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias[rows], requires_grad=False)
        start = rows.stop
    return weight, bias


def as_parameter(tensor: torch.Tensor | None) -> nn.Parameter | None:
    """`tensor` as a frozen parameter over the same memory (None stays None)."""
    if tensor is None or isinstance(tensor, nn.Parameter):
        return tensor
    return nn.Parameter(tensor, requires_grad=False)


class Product:
    """`F.linear(x, weight, bias)`, through the kernel prepared for `weight` when it was made.

    `kernel` is the `ChosenKernels` of each row count, or the `Int8Weight` copy; `measurement`
    what `"measured"` timed (None where nothing was timed). A weight changed afterwards is not
    seen by the prepared copies: make the product again.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        kernels: str = "measured",
        quantization: str | None = None,
    ) -> None:
        # As parameters for a compiled graph, so that inductor's `freezing` folds them in as
        # constants (a plain tensor attribute would stay an input of the graph); as plain
        # tensors over the same memory for the eager kernels, which a parameter's subclass
        # dispatch would slow by a microsecond or two a call.
        self.weight, self.bias = as_parameter(weight), as_parameter(bias)
        weight = weight.detach()
        self._bias = None if bias is None else bias.detach()
        self.measurement: KernelMeasurement | None = None
        self.kernel: ChosenKernels | Int8Weight
        if quantization == "int8":
            self.kernel = Int8Weight(weight)
            return
        choice: dict[int, str] = {}
        # Where F.linear is the only candidate (a GPU, float16) there is nothing to time.
        if kernels == "measured" and len(candidates_for(weight)) > 1:
            self.measurement = measure_kernels(weight, self._bias)
            choice = self.measurement.chosen()
        elif kernels == "packed" and can_pack(weight):
            choice = packed_choice()
        self.kernel = ChosenKernels(weight, choice)

    @property
    def is_packed(self) -> bool:
        """Whether some row count goes through MKL's packed copy."""
        return isinstance(self.kernel, ChosenKernels) and "mkl-packed" in self.kernel.names

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and isinstance(self.kernel, ChosenKernels):
            # Inside a graph inductor chooses the product's kernel itself (it cannot lower the
            # prepared ones for a symbolic row count), from the parameters it may freeze.
            return F.linear(x, self.weight, self.bias)
        return self.kernel.linear(x, self._bias)

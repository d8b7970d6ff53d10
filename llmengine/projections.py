"""The model's matrix products, prepared once at load so that each step pays only for them.

Two preparations, neither of which changes a parameter's name or value:

- fusion: linear layers that read the same input (Q, K and V; gate and up) are computed as
  one product with their weights concatenated: one operator instead of three, one pass over
  the input;
- kernels (`llmengine.kernels`): each weight gets the kernel that multiplies by it fastest for
  each row count, either measured on this machine (`"measured"`, what `load_model` does) or
  by the fixed rule of MKL's packed copy for 4 to 48 rows (`"packed"`, lesson 23). An eager
  `F.linear` hands MKL the plain weight, which MKL repacks on every call; a prepared kernel
  reads a copy laid out once for it, which costs the weight's memory again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from llmengine.kernels import (
    ChosenKernels,
    KernelMeasurement,
    can_pack,
    candidates_for,
    measure_kernels,
    packed_choice,
)
from llmengine.quantization import QUANTIZATIONS, Int8Weight

PREPARATIONS = ("measured", "packed", "eager")


def check_preparation(preparation: str, quantization: str | None) -> None:
    """ValueError unless `preparation` is one of `PREPARATIONS` and `quantization` None or one
    of `QUANTIZATIONS` (`load_model` checks before it reads a weight)."""
    if preparation not in PREPARATIONS:
        raise ValueError(f"kernels must be one of {PREPARATIONS}, not {preparation!r}")
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, not {quantization!r}")


class HasWeight(Protocol):
    weight: torch.Tensor


class LinearGroup:
    """Linear layers (or an embedding used as one) that read the same input.

    Unprepared, calling the group runs the layers one by one. `fuse()` concatenates their
    weights into one matrix and makes each layer's weight a view of its rows, so both
    spellings share memory; `prepare_kernels()` gives the fused weight its kernels.
    Calling the group returns every layer's output side by side; `split` cuts them apart.
    """

    def __init__(self, *layers: HasWeight) -> None:
        self.layers: Sequence[HasWeight] = layers
        self.sizes = [layer.weight.shape[0] for layer in layers]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.kernels: ChosenKernels | None = None
        self.preparation: str | None = None
        self.measurement: KernelMeasurement | None = None
        self.quantization: str | None = None
        self.int8: Int8Weight | None = None

    @property
    def is_fused(self) -> bool:
        return self.weight is not None

    @property
    def is_packed(self) -> bool:
        """Whether some row count goes through MKL's packed copy."""
        return self.kernels is not None and "mkl-packed" in self.kernels.names

    def fuse(self) -> None:
        """One weight matrix (and bias) for the group; every layer's parameters point into it."""
        self.kernels = None
        if len(self.layers) == 1:
            self.weight, self.bias = self.layers[0].weight, getattr(self.layers[0], "bias", None)
            return
        self.weight = torch.cat([layer.weight for layer in self.layers])
        biases = [getattr(layer, "bias", None) for layer in self.layers]
        self.bias = None if biases[0] is None else torch.cat(biases)
        start = 0
        for layer, size in zip(self.layers, self.sizes, strict=True):
            rows = slice(start, start + size)
            layer.weight = nn.Parameter(self.weight[rows], requires_grad=False)
            if self.bias is not None:
                layer.bias = nn.Parameter(self.bias[rows], requires_grad=False)
            start = rows.stop

    def prepare_kernels(
        self, preparation: str = "measured", quantization: str | None = None
    ) -> None:
        """Fuse if needed, then choose the kernel of each row count (see `PREPARATIONS`).

        `"measured"` times the candidates `llmengine.kernels` has for this weight here;
        `"packed"` takes MKL's packed copy for `PACKED_ROWS` where it can pack; `"eager"`
        keeps `F.linear`. `quantization="int8"` multiplies by an int8 copy of the weight
        instead (`llmengine.quantization`), whatever the preparation. Both are remembered: a
        group moved to another device or dtype is prepared again the same way (`refresh`).
        """
        check_preparation(preparation, quantization)
        self.preparation, self.quantization = preparation, quantization
        if not self.is_fused:
            self.fuse()
        assert self.weight is not None
        self.kernels = self.measurement = self.int8 = None
        if quantization == "int8":
            self.int8 = Int8Weight(self.weight)
            return
        # Where F.linear is the only candidate (a GPU, float16) there is nothing to time.
        if preparation == "measured" and len(candidates_for(self.weight)) > 1:
            self.measurement = measure_kernels(self.weight, self.bias)
            choice = self.measurement.chosen()
        elif preparation == "packed":
            choice = packed_choice() if can_pack(self.weight) else {}
        else:
            choice = {}
        if set(choice.values()) - {"eager"}:
            self.kernels = ChosenKernels(self.weight, choice)

    def refresh(self) -> None:
        """After the layers were converted (`.to(...)`), prepare the group again as it was."""
        if self.is_fused:
            self.fuse()
        if self.preparation is not None:
            self.prepare_kernels(self.preparation, self.quantization)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8 is not None:
            return self.int8.linear(x, self.bias)
        # Inductor cannot lower the prepared kernels for a symbolic row count; a compiled
        # forward takes the plain weight and leaves the product to inductor's own choice.
        if self.kernels is not None and not torch.compiler.is_compiling():
            return self.kernels.linear(x, self.bias)
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        outputs = self._one_by_one(x)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's output for input `x`, in the order the layers were given."""
        if self.weight is None:
            return self._one_by_one(x)
        return list(self(x).split(self.sizes, dim=-1))

    def _one_by_one(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [F.linear(x, layer.weight, getattr(layer, "bias", None)) for layer in self.layers]

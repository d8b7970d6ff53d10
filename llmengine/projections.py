"""The model's matrix products, prepared once at load so that each step pays only for them.

Two preparations, neither of which changes a parameter's name or value:

- fusion: linear layers that read the same input (Q, K and V; gate and up) are computed as
  one product with their weights concatenated: one operator instead of three, one pass over
  the input;
- packing: on a CPU with MKL, each weight is also stored in the blocked layout MKL's GEMM
  reads. An eager `F.linear` hands MKL the plain weight, and MKL repacks the whole matrix on
  every call; for the few rows of a decode step that repacking costs as much as the product
  (lesson 23 measures it). A packed weight is packed once. MKL is told to expect
  `PACK_ROWS` rows, but one packed copy serves products of any row count. It pays only for
  a few rows, though: with one to three rows MKL's unpacked path is a matrix-vector product
  that never repacked, and with many rows the repacking is a small share of the product, so
  `PACKED_ROWS` (measured on a 2-core Xeon; lesson 23 measures yours) bounds where it is used.

Packing keeps the plain weight too (MKL's fallback needs it), so it costs memory: about 2.6
times the weight again, measured for these shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

PACK_ROWS = 32
PACKED_ROWS = range(4, 49)


class HasWeight(Protocol):
    weight: torch.Tensor


def can_pack(weight: torch.Tensor) -> bool:
    """MKL's packed product exists for float32 weights on the CPU of an MKL build of torch."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkl.is_available()
    )


class PackedWeight:
    """A weight `[out, in]` with MKL's packed copy of it; `linear` multiplies by it."""

    def __init__(self, weight: torch.Tensor) -> None:
        if not can_pack(weight):
            raise ValueError(f"cannot pack a {weight.dtype} weight on {weight.device}")
        self.weight = weight
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` for `x` `[..., in]`: through the packed copy when `x` has
        a row count in `PACKED_ROWS`, else through the plain weight."""
        if x.numel() // x.shape[-1] not in PACKED_ROWS:
            return F.linear(x, self.weight, bias)
        return self.packed_linear(x, bias)

    def packed_linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` through the packed copy, whatever the row count."""
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkl._mkl_linear(rows, self.packed, self.weight, bias, rows.shape[0])
        return out.view(*x.shape[:-1], out.shape[-1])


class LinearGroup:
    """Linear layers (or an embedding used as one) that read the same input.

    Unprepared, calling the group runs the layers one by one. `fuse()` concatenates their
    weights into one matrix and makes each layer's weight a view of its rows, so both
    spellings share memory; `pack()` adds MKL's packed copy where `can_pack` allows.
    Calling the group returns every layer's output side by side; `split` cuts them apart.
    """

    def __init__(self, *layers: HasWeight) -> None:
        self.layers: Sequence[HasWeight] = layers
        self.sizes = [layer.weight.shape[0] for layer in layers]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.packed: PackedWeight | None = None
        self.wants_packing = False

    @property
    def is_fused(self) -> bool:
        return self.weight is not None

    @property
    def is_packed(self) -> bool:
        return self.packed is not None

    def fuse(self) -> None:
        """One weight matrix (and bias) for the group; every layer's parameters point into it."""
        self.packed = None
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

    def pack(self) -> bool:
        """Fuse if needed, then pack where MKL can; True when the group is now packed.

        The wish is remembered: a group moved where it cannot be packed is packed again when
        it is moved back (`refresh`)."""
        self.wants_packing = True
        if not self.is_fused:
            self.fuse()
        assert self.weight is not None
        self.packed = PackedWeight(self.weight) if can_pack(self.weight) else None
        return self.is_packed

    def refresh(self) -> None:
        """After the layers were converted (`.to(...)`), prepare the group again as it was.

        A group moved where packing is impossible (a GPU, bfloat16) stays fused only.
        """
        if self.is_fused:
            self.fuse()
        if self.wants_packing:
            self.pack()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Inductor cannot lower MKL's packed product for a symbolic row count; a compiled
        # forward takes the plain weight and leaves the product to inductor's own choice.
        if self.packed is not None and not torch.compiler.is_compiling():
            return self.packed.linear(x, self.bias)
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

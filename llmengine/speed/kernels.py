"""Matrix-product kernels chosen by measurement, per weight shape and row count.

The same `x @ W.T` can run through several CPU libraries, and which is fastest depends on
the machine, the weight's shape and how many rows `x` has: on one AMD EPYC oneDNN with a
reordered weight is twice as fast as `F.linear` for a decode step's few rows, on another CPU
MKL's packed copy wins at some sizes and plain `F.linear` at others. So nothing is assumed:
`measure_kernels` times every candidate the weight allows at each row bucket and keeps the
fastest, and `ChosenKernels` dispatches each call by its row count. Eager `F.linear` is
always a candidate and keeps a bucket unless another kernel beats it by `MARGIN`, so no
product is slower than eager beyond the noise of the measurement.

Every candidate computes the same product in the weight's own dtype; the results differ
only by summation order (within 1e-4 of `F.linear` for float32, which the tests check).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MARGIN = 0.05  # another kernel must be this much faster than F.linear to replace it
ROUNDS = 3  # candidates are timed in turn, this many times; each keeps its fastest
TARGET_SECONDS = 1e-3  # each timing repeats the product for about this long

# MKL is told to expect this many rows when it packs; one packed copy serves any row count.
PACK_ROWS = 32
# Where `load_model(kernels="packed")` uses MKL's packed copy without measuring: with one to
# three rows MKL's unpacked path is a matrix-vector product that never repacked, and with many
# rows the repacking is a small share of the product (measured on a 2-core Xeon; lesson 23).
PACKED_ROWS = range(4, 49)


def can_pack(weight: torch.Tensor) -> bool:
    """MKL's packed product exists for float32 weights on the CPU of an MKL build of torch."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkl.is_available()
    )


class PackedWeight:
    """A weight `[out, in]` with MKL's packed copy of it, which `packed_linear` multiplies by.

    Packing keeps the plain weight too (MKL's fallback needs it), so it costs memory: about
    2.6 times the weight again, measured for these shapes.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        if not can_pack(weight):
            raise ValueError(f"cannot pack a {weight.dtype} weight on {weight.device}")
        self.weight = weight
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS)

    def packed_linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` through the packed copy, whatever the row count."""
        out = self.multiply_rows(x.reshape(-1, x.shape[-1]), bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    def multiply_rows(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The product for a 2-D `[rows, in]` input, as MKL's packed product takes it."""
        return torch.ops.mkl._mkl_linear(rows, self.packed, self.weight, bias, rows.shape[0])


@dataclass(frozen=True)
class Kernel:
    """One way to compute `F.linear(x, weight, bias)` for 2-D `x`.

    `prepare(weight)` builds the operand once (a reordered copy, say); `run(operand, x,
    weight, bias)` multiplies. `applies(weight)` says whether this machine and dtype have it.
    """

    name: str
    applies: Callable[[torch.Tensor], bool]
    prepare: Callable[[torch.Tensor], Any]
    run: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def _onednn_applies(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


KERNELS: dict[str, Kernel] = {
    kernel.name: kernel
    for kernel in (
        Kernel(
            "eager",
            applies=lambda weight: True,
            prepare=lambda weight: None,
            run=lambda operand, x, weight, bias: F.linear(x, weight, bias),
        ),
        # MKL's GEMM on a copy stored in its blocked layout (an eager F.linear repacks the
        # plain weight into that layout on every call).
        Kernel(
            "mkl-packed",
            applies=can_pack,
            prepare=PackedWeight,
            run=lambda packed, x, weight, bias: packed.multiply_rows(x, bias),
        ),
        # oneDNN's inner product on a copy reordered once into the layout it prefers for
        # this CPU (AVX2, AVX-512, or AVX512_BF16 instructions for bfloat16).
        Kernel(
            "onednn",
            applies=_onednn_applies,
            prepare=lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight, None),
            run=lambda reordered, x, weight, bias: torch.ops.mkldnn._linear_pointwise(
                x, reordered, bias, "none", [], ""
            ),
        ),
    )
}


@dataclass(frozen=True)
class BucketTiming:
    """What each candidate took for one row bucket (seconds per product), and the winner."""

    rows: int
    seconds: dict[str, float]
    chosen: str

    @property
    def speedup(self) -> float:
        """Eager's time over the chosen kernel's: 1.0 where eager was kept."""
        return self.seconds["eager"] / self.seconds[self.chosen]


@dataclass(frozen=True)
class KernelMeasurement:
    """The timings behind one weight shape's choice, one entry per row bucket."""

    shape: tuple[int, int]
    dtype: torch.dtype
    threads: int
    buckets: tuple[BucketTiming, ...]

    def chosen(self) -> dict[int, str]:
        return {bucket.rows: bucket.chosen for bucket in self.buckets}


_measured: dict[tuple, KernelMeasurement] = {}


def packed_choice() -> dict[int, str]:
    """The fixed rule of `kernels="packed"`: MKL's packed copy for `PACKED_ROWS`, else eager."""
    return {
        PACKED_ROWS.start - 1: "eager",
        PACKED_ROWS.stop - 1: "mkl-packed",
        PACKED_ROWS.stop: "eager",
    }


def candidates_for(weight: torch.Tensor, names: Sequence[str] | None = None) -> list[str]:
    """The kernels (by name) that can multiply by `weight` here, eager first."""
    names = list(KERNELS) if names is None else ["eager", *(n for n in names if n != "eager")]
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; known: {sorted(KERNELS)}")
    return [name for name in names if KERNELS[name].applies(weight)]


def measure_kernels(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    buckets: Sequence[int] = ROW_BUCKETS,
    names: Sequence[str] | None = None,
) -> KernelMeasurement:
    """Time every candidate kernel for `weight` at each row bucket; keep the fastest.

    Measured once per shape, dtype, bias, thread count and candidate set in a process:
    layers of the same shape, and later loads, reuse it.
    """
    candidates = candidates_for(weight, names)
    threads = torch.get_num_threads()
    key = (tuple(weight.shape), weight.dtype, bias is not None, threads, tuple(candidates))
    key += (tuple(buckets),)
    if key not in _measured:
        operands = {name: KERNELS[name].prepare(weight) for name in candidates}
        timings = tuple(_time_bucket(weight, bias, rows, operands) for rows in sorted(set(buckets)))
        _measured[key] = KernelMeasurement(tuple(weight.shape), weight.dtype, threads, timings)
    return _measured[key]


def _time_bucket(
    weight: torch.Tensor, bias: torch.Tensor | None, rows: int, operands: dict[str, Any]
) -> BucketTiming:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, weight.shape[1], generator=generator).to(weight.dtype)
    calls = {
        name: (lambda name=name, operand=operand: KERNELS[name].run(operand, x, weight, bias))
        for name, operand in operands.items()
    }
    repeats = {name: _repeats_for(call) for name, call in calls.items()}
    best = dict.fromkeys(calls, float("inf"))
    # In turn, round after round, so that a burst of load elsewhere hits every candidate.
    for _ in range(ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / repeats[name])
    return BucketTiming(rows, best, fastest_kernel(best))


def fastest_kernel(seconds: dict[str, float]) -> str:
    """The kernel to keep given each candidate's time: the fastest, if it beats eager
    `F.linear` by `MARGIN` (a smaller gain could be the measurement's noise), else eager."""
    fastest = min(seconds, key=seconds.__getitem__)
    return fastest if seconds[fastest] < (1 - MARGIN) * seconds["eager"] else "eager"


def _repeats_for(call: Callable[[], torch.Tensor]) -> int:
    """How many calls make one timing last about TARGET_SECONDS (after a warm-up call)."""
    call()
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    return max(1, min(1000, int(TARGET_SECONDS / max(once, 1e-7))))


class ChosenKernels:
    """A weight's products, each through the kernel chosen for its row count.

    `choice` maps a bucket's upper row count to a kernel name; a product of `r` rows uses the
    first bucket with at least `r` rows, and the largest bucket beyond it. An empty choice
    is eager `F.linear` for every row count. Only the kernels some bucket chose are prepared
    (each prepared copy costs the weight's memory again).
    """

    def __init__(self, weight: torch.Tensor, choice: dict[int, str]) -> None:
        self.weight = weight
        self.bounds = sorted(choice)
        self.names = [choice[rows] for rows in self.bounds]
        self.operands = {name: KERNELS[name].prepare(weight) for name in set(self.names)}
        self.is_eager = set(self.names) <= {"eager"}

    def kernel_for(self, rows: int) -> str:
        """The kernel a product of `rows` rows goes through."""
        for bound, name in zip(self.bounds, self.names, strict=True):
            if rows <= bound:
                return name
        return self.names[-1] if self.names else "eager"

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` for `x` `[..., in]`, through the chosen kernel (eager
        only: inside a compiled graph `Product` leaves the product to inductor)."""
        if self.is_eager:
            return F.linear(x, self.weight, bias)
        rows = x.reshape(-1, x.shape[-1])
        name = self.kernel_for(rows.shape[0])
        if name == "eager":
            return F.linear(x, self.weight, bias)
        out = KERNELS[name].run(self.operands[name], rows, self.weight, bias)
        return out.view(*x.shape[:-1], out.shape[-1])

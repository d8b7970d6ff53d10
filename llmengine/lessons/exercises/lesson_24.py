"""Lesson 24's exercises: the roofline's arithmetic, on the lesson's models and ceilings.

Nothing here is timed. The checkers count with the lesson's own functions
(`roofline.bytes_and_flops_rows`, `roofline.product_intensity`, `roofline.Ceilings`), so the
answers are the same on every machine: a machine's ceilings are given in the question, not
measured.
"""

from __future__ import annotations

from llmengine.bench.decode_step import HELD_OUT_CONFIG
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.roofline import (
    BYTES_PER_WEIGHT,
    Ceilings,
    bytes_and_flops_rows,
    product_intensity,
)

STORAGES = tuple(BYTES_PER_WEIGHT)


def _storage(storage: str) -> int:
    if storage not in BYTES_PER_WEIGHT:
        raise ValueError(f"storage {storage!r}: one of {', '.join(STORAGES)}")
    return BYTES_PER_WEIGHT[storage]


def bytes_per_position(storage: str) -> int:
    """Weight bytes one decode position of the random 25M model reads, stored as `storage`."""
    column = 2 + STORAGES.index(storage)  # the table's columns: model, rows, then each storage
    return bytes_and_flops_rows({"random 25M": HELD_OUT_CONFIG}, (1,))[0][column]


def one_row_bound(bandwidth_gb_s: float, storage: str) -> float:
    """Tokens per second one stream of the 25M model decodes at most on a machine reading
    memory at `bandwidth_gb_s`: every step reads every weight once, and nothing else."""
    return bandwidth_gb_s * 1e9 / bytes_per_position(storage)


def check_one_row_bound(
    answer: float | None, bandwidth_gb_s: float = 40.0, storage: str = "int8"
) -> Verdict:
    """Exercise 1: the one-row bound of the 25M model at a given bandwidth, within 1%."""
    _storage(storage)
    if answer is None:
        return check_value(None, None, what="the one-row bound")
    return check_value(
        answer,
        one_row_bound(bandwidth_gb_s, storage),
        what=f"the tokens/s one stream of the 25M model decodes at most in {storage} at "
        f"{bandwidth_gb_s:g} GB/s",
        tolerance=0.01,
        explain=f"The bandwidth over the bytes a step reads: every weight, "
        f"{BYTES_PER_WEIGHT[storage]} byte(s) each.",
    )


def check_intensity(answer: float | None, rows: int = 16, storage: str = "int8") -> Verdict:
    """Exercise 2: FLOPs per byte of weight of a product of `rows` rows in `storage`."""
    size = _storage(storage)
    if answer is None:
        return check_value(None, None, what="the arithmetic intensity")
    return check_value(
        answer,
        product_intensity(rows, size),
        what=f"the FLOPs per byte of a {rows}-row product on {storage} weights",
        explain="Two FLOPs per weight per row, over the bytes of that weight.",
    )


def rows_at_the_ridge(bandwidth_gb_s: float, gflop_s: float, storage: str) -> int:
    """The fewest rows whose product reaches the ridge point of a machine with these ceilings:
    below it the product is bound by memory, from it on by arithmetic."""
    ridge = Ceilings(bandwidth_gb_s * 1e9, gflop_s * 1e9).ridge
    rows = 1
    while product_intensity(rows, _storage(storage)) < ridge:
        rows += 1
    return rows


def check_rows_at_the_ridge(
    answer: int | None,
    bandwidth_gb_s: float = 45.0,
    gflop_s: float = 1000.0,
    storage: str = "float32",
) -> Verdict:
    """Exercise 3: from how many rows a product stops being bound by reading its weights."""
    _storage(storage)
    if answer is None:
        return check_value(None, None, what="the rows at the ridge point")
    return check_value(
        answer,
        rows_at_the_ridge(bandwidth_gb_s, gflop_s, storage),
        what=f"the fewest rows that reach the ridge of {bandwidth_gb_s:g} GB/s and "
        f"{gflop_s:g} GFLOP/s on {storage} weights",
        explain="The ridge is FLOP/s over bytes per second; a product's intensity is "
        "2 x rows / bytes per weight.",
    )

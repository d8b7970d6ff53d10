"""Lesson 25's exercises: which graph a decode step runs, and where one stream's ceiling is.

Nothing here is timed. The bucket comes from the engine's own `graphs.buckets_for`; the
ceiling is the roofline's arithmetic with the machine given in the question (its last-level
cache and both bandwidths), so the answers are the same on every machine.
"""

from __future__ import annotations

from llmengine.bench.decode_step import HELD_OUT_CONFIG
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.roofline import BYTES_PER_WEIGHT
from llmengine.lessons.step_cost import weights_multiplied
from llmengine.runner.graphs import buckets_for


def padding_rows(rows: int, slots: int) -> int:
    """The rows of padding a decode step of `rows` rows carries in an engine of `slots` slots:
    it runs the graph of the smallest bucket the engine keeps that holds it."""
    if not 1 <= rows <= slots:
        raise ValueError(f"a decode step has 1 to {slots} rows, not {rows}")
    bucket = next(bucket for bucket in buckets_for(slots) if bucket >= rows)
    return bucket - rows


def check_padding_rows(answer: int | None, rows: int = 9, slots: int = 12) -> Verdict:
    """Exercise 1: the padded rows of a decode step run as a graph."""
    expected = padding_rows(rows, slots)
    if answer is None:
        return check_value(None, None, what="the padding rows")
    return check_value(
        answer,
        expected,
        what=f"the padding rows of a {rows}-row decode step in an engine of {slots} slots",
        explain=f"It runs the bucket of {rows + expected} rows, the smallest of "
        f"{buckets_for(slots)} that holds {rows}.",
    )


def one_row_ceiling(storage: str, cache_mb: float, cache_gb_s: float, dram_gb_s: float) -> float:
    """Tokens per second one stream of the 25M model decodes at most when the weights stay in
    a last-level cache of `cache_mb` MB if they fit (read at `cache_gb_s`), else stream from
    DRAM (read at `dram_gb_s`) on every step."""
    if storage not in BYTES_PER_WEIGHT:
        raise ValueError(f"storage {storage!r}: one of {', '.join(BYTES_PER_WEIGHT)}")
    weight_bytes = weights_multiplied(HELD_OUT_CONFIG) * BYTES_PER_WEIGHT[storage]
    bandwidth = cache_gb_s if weight_bytes <= cache_mb * 1e6 else dram_gb_s
    return bandwidth * 1e9 / weight_bytes


def check_one_row_ceiling(
    answer: float | None,
    storage: str = "int8",
    cache_mb: float = 32.0,
    cache_gb_s: float = 60.0,
    dram_gb_s: float = 20.0,
) -> Verdict:
    """Exercise 2: the one-row ceiling of the 25M model on a given machine, within 1%."""
    expected = one_row_ceiling(storage, cache_mb, cache_gb_s, dram_gb_s)
    if answer is None:
        return check_value(None, None, what="the one-row ceiling")
    return check_value(
        answer,
        expected,
        what=f"the tokens/s one stream of the 25M model decodes at most in {storage} with a "
        f"{cache_mb:g} MB cache at {cache_gb_s:g} GB/s and DRAM at {dram_gb_s:g} GB/s",
        tolerance=0.01,
        explain="The weights' bytes decide where they are read from: a working set that fits "
        "in the cache stays there between steps; one that does not streams from DRAM.",
    )

"""Lesson 25's exercises: each checker right on the answer worked out here by another route
(the buckets listed by hand, the 25M model's weights counted from its parameters), wrong on
another, unanswered on None."""

from __future__ import annotations

import pytest

from llmengine.bench.decode_step import HELD_OUT_CONFIG, random_llama
from llmengine.lessons.exercises.lesson_25 import check_one_row_ceiling, check_padding_rows


def test_padding_rows() -> None:
    # 12 slots: the buckets 1, 2, 4, 8 and 16, the first that holds 12.
    assert check_padding_rows(16 - 9, rows=9, slots=12).right is True
    assert check_padding_rows(12 - 9, rows=9, slots=12).right is False
    assert check_padding_rows(0, rows=8, slots=12).right is True
    assert check_padding_rows(16 - 13, rows=13, slots=16).right is True
    assert check_padding_rows(None).right is None
    with pytest.raises(ValueError, match="rows"):
        check_padding_rows(0, rows=13, slots=12)


def test_one_row_ceiling() -> None:
    model = random_llama(HELD_OUT_CONFIG)
    weights = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name
    )
    # int8: about 24 MB, inside a 32 MB cache; float32: about 97 MB, streamed from DRAM.
    assert check_one_row_ceiling(60e9 / weights, "int8", 32, 60, 20).right is True
    assert check_one_row_ceiling(20e9 / weights, "int8", 32, 60, 20).right is False
    assert check_one_row_ceiling(20e9 / (4 * weights), "float32", 32, 60, 20).right is True
    assert check_one_row_ceiling(60e9 / (4 * weights), "float32", 32, 60, 20).right is False
    assert check_one_row_ceiling(20e9 / weights, "int8", 16, 60, 20).right is True
    assert check_one_row_ceiling(None).right is None
    with pytest.raises(ValueError, match="storage"):
        check_one_row_ceiling(1.0, "float16")

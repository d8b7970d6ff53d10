"""Lesson 24's exercises: each checker right on the answer worked out here by another route
(the 25M model's own weights counted for its one-row bound, the intensity and the ridge by
hand), wrong on another, unanswered on None."""

from __future__ import annotations

import pytest

from llmengine.bench.decode_step import HELD_OUT_CONFIG, random_llama
from llmengine.lessons.exercises.lesson_24 import (
    check_intensity,
    check_one_row_bound,
    check_rows_at_the_ridge,
)


def test_one_row_bound() -> None:
    model = random_llama(HELD_OUT_CONFIG)
    assert not HELD_OUT_CONFIG.tie_word_embeddings  # the embedding is looked up, not multiplied
    weights = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name
    )
    assert check_one_row_bound(40e9 / weights, 40, "int8").right is True
    assert check_one_row_bound(40e9 / (2 * weights), 40, "bfloat16").right is True
    assert check_one_row_bound(40e9 / (4 * weights), 40, "int8").right is False
    assert check_one_row_bound(None).right is None
    with pytest.raises(ValueError, match="storage"):
        check_one_row_bound(1, 40, "float16")


def test_intensity() -> None:
    assert check_intensity(2 * 16 / 1, 16, "int8").right is True
    assert check_intensity(2 * 16 / 4, 16, "int8").right is False
    assert check_intensity(None).right is None


def test_rows_at_the_ridge() -> None:
    ridge = 1000 / 45  # FLOPs per byte where the two ceilings meet: 22.2
    right = 45  # 2 x 44 / 4 = 22 is under the ridge, 2 x 45 / 4 = 22.5 is over it
    assert 2 * (right - 1) / 4 < ridge <= 2 * right / 4
    assert check_rows_at_the_ridge(right, 45, 1000, "float32").right is True
    assert check_rows_at_the_ridge(right - 1, 45, 1000, "float32").right is False
    # int8 on a machine whose ridge is 201: 2 x 100 / 1 = 200 is under it, 2 x 101 = 202 over
    assert check_rows_at_the_ridge(101, 10, 2010, "int8").right is True
    assert check_rows_at_the_ridge(100, 10, 2010, "int8").right is False
    assert check_rows_at_the_ridge(None).right is None

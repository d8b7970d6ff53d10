"""Lesson 24's exercises: each checker right on the answer worked out here by another route
(the 25M model's own weights counted, the intensity and the ridge by hand), wrong on another,
unanswered on None."""

from __future__ import annotations

import pytest

from llmengine.bench.decode_step import HELD_OUT_CONFIG, random_llama
from llmengine.lessons.exercises.lesson_24 import (
    check_bytes_per_position,
    check_intensity,
    check_rows_at_the_ridge,
)


def test_bytes_per_position() -> None:
    model = random_llama(HELD_OUT_CONFIG)
    assert not HELD_OUT_CONFIG.tie_word_embeddings  # the embedding is looked up, not multiplied
    weights = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name
    )
    assert check_bytes_per_position(2 * weights, "bfloat16").right is True
    assert check_bytes_per_position(weights, "int8").right is True
    assert check_bytes_per_position(4 * weights, "bfloat16").right is False
    assert check_bytes_per_position(None).right is None
    with pytest.raises(ValueError, match="storage"):
        check_bytes_per_position(1, "float16")


def test_intensity() -> None:
    assert check_intensity(2 * 16 / 1, 16, "int8").right is True
    assert check_intensity(2 * 16 / 4, 16, "int8").right is False
    assert check_intensity(None).right is None


def test_rows_at_the_ridge() -> None:
    ridge = 400 / 50  # FLOPs per byte where the two ceilings meet
    right = int(ridge * 4 / 2)  # 2 x rows / 4 bytes = ridge
    assert check_rows_at_the_ridge(right, 50, 400, "float32").right is True
    assert check_rows_at_the_ridge(right // 2, 50, 400, "float32").right is False
    assert check_rows_at_the_ridge(right // 4, 50, 400, "int8").right is True
    assert check_rows_at_the_ridge(None).right is None

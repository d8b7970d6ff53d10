"""Lesson 26's exercises: each checker right on the answer worked out here by another route
(the configuration's counts by hand, the greatest common divisor), wrong on another,
unanswered on None."""

from __future__ import annotations

import math

import llmengine
from llmengine.lessons.exercises.lesson_26 import (
    check_all_reduces,
    check_k_proj_shape,
    check_largest_size,
    largest_tensor_parallel_size,
)
from llmengine.model.config import LlamaConfig

CONFIG = LlamaConfig.from_file(llmengine.embedded_model_path() / "config.json")


def test_all_reduces() -> None:
    right = 2 * CONFIG.num_hidden_layers
    assert check_all_reduces(right).right is True
    assert check_all_reduces(CONFIG.num_hidden_layers).right is False
    assert check_all_reduces(None).right is None


def test_k_proj_shape() -> None:
    out = CONFIG.num_key_value_heads // 2 * CONFIG.head_dim
    assert check_k_proj_shape((out, CONFIG.hidden_size)).right is True
    assert check_k_proj_shape([out, CONFIG.hidden_size]).right is True
    assert check_k_proj_shape((2 * out, CONFIG.hidden_size)).right is False
    assert check_k_proj_shape((out, CONFIG.hidden_size // 2)).right is False
    assert check_k_proj_shape((out // 2, CONFIG.hidden_size), world=4).right is True
    assert check_k_proj_shape(None).right is None


def test_largest_size() -> None:
    right = math.gcd(
        CONFIG.num_attention_heads, CONFIG.num_key_value_heads, CONFIG.intermediate_size
    )
    assert check_largest_size(right).right is True
    assert check_largest_size(CONFIG.num_attention_heads).right is False
    assert check_largest_size(None).right is None
    assert largest_tensor_parallel_size(LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=18, num_hidden_layers=1,
        num_attention_heads=6, num_key_value_heads=6, head_dim=2, max_position_embeddings=8,
    )) == 6  # fmt: skip

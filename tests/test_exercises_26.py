"""Lesson 26's exercises: each checker right on the answer worked out here by another route
(the configuration's counts by hand, the greatest common divisor), wrong on another (the
numbers the lesson prints among them),
unanswered on None."""

from __future__ import annotations

import math

import llmengine
from llmengine.lessons.exercises.lesson_26 import (
    check_down_proj_shape,
    check_largest_size,
    check_vocab_parallel_bytes,
    largest_tensor_parallel_size,
)
from llmengine.lessons.tensor_parallel import rank_parameters
from llmengine.model.config import LlamaConfig

CONFIG = LlamaConfig.from_file(llmengine.embedded_model_path() / "config.json")


def test_vocab_parallel_bytes() -> None:
    embedding = CONFIG.vocab_size * CONFIG.hidden_size
    right = 4 * (rank_parameters(CONFIG, 2) - embedding // 2)
    assert check_vocab_parallel_bytes(right).right is True
    assert check_vocab_parallel_bytes(4 * rank_parameters(CONFIG, 2)).right is False  # printed
    assert check_vocab_parallel_bytes(right - 4 * embedding // 2).right is False  # none kept
    assert check_vocab_parallel_bytes(4 * (rank_parameters(CONFIG, 4) - embedding * 3 // 4),
                                      world=4).right is True  # fmt: skip
    assert check_vocab_parallel_bytes(None).right is None


def test_down_proj_shape() -> None:
    quarter = CONFIG.intermediate_size // 4
    assert check_down_proj_shape((CONFIG.hidden_size, quarter)).right is True
    assert check_down_proj_shape([CONFIG.hidden_size, quarter]).right is True
    assert check_down_proj_shape((quarter, CONFIG.hidden_size)).right is False  # cut by rows
    assert check_down_proj_shape((CONFIG.hidden_size, 2 * quarter)).right is False  # 2 ranks'
    assert check_down_proj_shape((CONFIG.hidden_size // 4, CONFIG.intermediate_size)).right is False
    assert check_down_proj_shape((CONFIG.hidden_size, 2 * quarter), world=2).right is True
    assert check_down_proj_shape(None).right is None


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

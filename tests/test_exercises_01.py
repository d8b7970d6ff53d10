"""Lesson 01's exercise checkers: the right answer, computed here by formula, is right; a
wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import json
import math

from llmengine.lessons.exercises.lesson_01 import (
    check_pairs_turning_with_llama3_theta,
    check_parameters_with_two_kv_heads,
)
from llmengine.model.loader import embedded_model_path

RAW = json.loads((embedded_model_path() / "config.json").read_text())


def test_parameters_with_two_kv_heads() -> None:
    hidden, layers = RAW["hidden_size"], RAW["num_hidden_layers"]
    head_dim = hidden // RAW["num_attention_heads"]
    per_layer = (
        2 * hidden * hidden  # q and o
        + 2 * hidden * 2 * head_dim  # k and v with 2 heads
        + 3 * hidden * RAW["intermediate_size"]
        + 2 * hidden  # two norms
    )
    expected = RAW["vocab_size"] * hidden + layers * per_layer + hidden  # tied head, final norm
    assert check_parameters_with_two_kv_heads(expected).right is True
    assert check_parameters_with_two_kv_heads(3_426_560).right is False
    assert check_parameters_with_two_kv_heads(None).right is None


def test_pairs_turning_with_llama3_theta() -> None:
    head_dim = RAW["hidden_size"] // RAW["num_attention_heads"]
    wavelengths = [2 * math.pi * 500000.0 ** (2 * i / head_dim) for i in range(head_dim // 2)]
    expected = sum(length <= RAW["max_position_embeddings"] for length in wavelengths)
    assert expected == 6
    assert check_pairs_turning_with_llama3_theta(expected).right is True
    assert check_pairs_turning_with_llama3_theta(8).right is False
    assert check_pairs_turning_with_llama3_theta(None).right is None

"""Lesson 23's exercises: each checker right on the count worked out here by another route,
wrong on another number, unanswered on None. Products are counted from the layer's shape
(seven projections, four once fused, plus the head), product FLOPs from the model's own
two-dimensional weights, attention FLOPs from the configuration by hand."""

from __future__ import annotations

import llmengine
from llmengine.lessons.exercises.lesson_23 import (
    check_attention_flops,
    check_product_flops,
    check_products_per_forward,
)


def test_products_per_forward() -> None:
    layers = 6
    assert check_products_per_forward(4 * layers + 1, layers, prepared=True).right is True
    assert check_products_per_forward(7 * layers + 1, layers, prepared=False).right is True
    assert check_products_per_forward(7 * layers + 1, layers, prepared=True).right is False
    assert check_products_per_forward(None).right is None


def test_product_flops() -> None:
    model = llmengine.load_model(kernels="eager")
    assert model.config.tie_word_embeddings  # the embedding table is the head, counted once
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    rows = 5
    assert check_product_flops(2 * rows * weights, rows).right is True
    assert check_product_flops(rows * weights, rows).right is False
    assert check_product_flops(None).right is None


def test_attention_flops() -> None:
    config = llmengine.load_model(kernels="eager").config
    rows, keys = 1, 128
    scores_and_values = 2 * (2 * keys * config.head_dim)
    right = rows * config.num_hidden_layers * config.num_attention_heads * scores_and_values
    assert check_attention_flops(right, rows, keys).right is True
    assert check_attention_flops(right // 2, rows, keys).right is False
    assert check_attention_flops(None).right is None

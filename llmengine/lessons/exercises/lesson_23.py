"""Lesson 23's exercises: what a decode step runs and computes, counted, never timed.

The checkers build the model the question names (the embedded model's shape, with as many
layers as asked, random weights) and count with the lesson's own functions: the matrix
products its forward runs (`step_cost.matrix_products_of`), and the FLOPs of a decode step
(`step_cost.decode_step_flops`). Counts are the same on every machine.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import llmengine
from llmengine.bench.decode_step import random_llama
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.step_cost import decode_step_flops, matrix_products_of, weights_multiplied
from llmengine.model.config import LlamaConfig
from llmengine.speed.prepare import prepare_for_speed


@cache
def embedded_config() -> LlamaConfig:
    """The embedded model's configuration."""
    return llmengine.load_model(kernels="eager").config


@cache
def products_per_forward(layers: int, prepared: bool) -> int:
    """The matrix products one forward runs, for the embedded shape with `layers` layers:
    the plain model (`prepared=False`) or the fused and packed one."""
    config = dataclasses.replace(embedded_config(), num_hidden_layers=layers)
    model = random_llama(config)
    return matrix_products_of(prepare_for_speed(model, "packed") if prepared else model)


def check_products_per_forward(
    answer: int | None, layers: int = 6, prepared: bool = True
) -> Verdict:
    """Exercise 1: how many matrix products a forward of a `layers`-layer model runs."""
    if answer is None:
        return check_value(None, None, what="the number of matrix products")
    version = "fused and packed" if prepared else "plain"
    return check_value(
        answer,
        products_per_forward(layers, prepared),
        what=f"the matrix products of one forward of the {version} {layers}-layer model",
        explain="Per layer: q, k, v, o, gate, up and down, seven plain, four fused (qkv, o, "
        "gate/up, down); and the output head once.",
    )


def product_flops(rows: int) -> int:
    """The matrix products' FLOPs of a decode step of `rows` rows of the embedded model:
    a decode step's FLOPs with no keys to attend to."""
    return decode_step_flops(embedded_config(), rows, keys=0)


def check_product_flops(answer: int | None, rows: int = 5) -> Verdict:
    """Exercise 2: the product FLOPs of a `rows`-row decode step of the embedded model."""
    if answer is None:
        return check_value(None, None, what="the product FLOPs")
    weights = weights_multiplied(embedded_config())
    return check_value(
        answer,
        product_flops(rows),
        what=f"the product FLOPs of a {rows}-row decode step of the embedded model",
        explain=f"Each row is multiplied by all {weights:,} weights, a multiply and an add each.",
    )


def attention_flops(rows: int, keys: int) -> int:
    """The attention FLOPs of a decode step of the embedded model: the step's FLOPs less
    those of its matrix products."""
    return decode_step_flops(embedded_config(), rows, keys) - product_flops(rows)


def check_attention_flops(answer: int | None, rows: int = 1, keys: int = 128) -> Verdict:
    """Exercise 3: the attention FLOPs of a decode step whose rows attend to `keys` keys."""
    if answer is None:
        return check_value(None, None, what="the attention FLOPs")
    return check_value(
        answer,
        attention_flops(rows, keys),
        what=f"the attention FLOPs of {rows} row(s) attending to {keys} keys",
        explain="Per layer and query head, each row scores every key (2 x keys x head_dim) "
        "and sums as many values again.",
    )

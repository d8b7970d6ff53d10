"""bench.precision: the measures of what a narrower weight costs, each checked on its own."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import llmengine
from llmengine.bench.precision import (
    PRECISIONS,
    greedy_agreement,
    held_out_ids,
    in_precision,
    max_logit_difference,
    perplexity,
    prompts_from,
)
from llmengine.speed.prepare import products
from llmengine.speed.quantization import Int8Weight


def test_greedy_agreement_counts_identical_sequences_and_common_prefixes():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    outputs = [[1, 2, 3, 4], [5, 0, 7, 8], [0, 9, 9, 9]]
    agreement = greedy_agreement(reference, outputs)
    assert (agreement.sequences, agreement.identical, agreement.tokens) == (3, 1, 4)
    assert agreement.mean_prefix == pytest.approx((4 + 1 + 0) / 3)
    assert agreement.prefix_share == pytest.approx(5 / 12)
    with pytest.raises(ValueError, match="same, non-zero number"):
        greedy_agreement(reference, outputs[:2])


def test_prompts_are_spread_through_the_text():
    prompts = prompts_from(list(range(100)), 4, 10)
    assert prompts == [list(range(s, s + 10)) for s in (0, 22, 44, 66)]
    with pytest.raises(ValueError, match="cannot give"):
        prompts_from(list(range(12)), 4, 10)


def test_perplexity_is_the_exponent_of_the_mean_loss_over_windows(model):
    ids = held_out_ids(llmengine.load_tokenizer())[:70]
    with torch.inference_mode():
        losses = [
            F.cross_entropy(
                model(torch.tensor([chunk[:-1]]))[0], torch.tensor(chunk[1:]), reduction="sum"
            )
            for chunk in (ids[0:33], ids[32:65], ids[64:70])
        ]
    expected = math.exp(sum(loss.item() for loss in losses) / 69)
    assert perplexity(model, ids, window=32) == pytest.approx(expected, rel=1e-5)


def test_the_held_out_text_is_predicted_far_better_than_chance(model):
    ids = held_out_ids(llmengine.load_tokenizer())[:600]
    assert 1 < perplexity(model, ids) < model.config.vocab_size / 10


def test_every_precision_is_a_converted_copy(model):
    ids = [5, 9, 2, 7, 11]
    reference = in_precision(model, PRECISIONS[0], kernels="eager")
    for precision in PRECISIONS:
        converted = in_precision(model, precision, kernels="eager")
        assert next(converted.parameters()).dtype == precision.dtype
        assert all(
            isinstance(product.kernel, Int8Weight) == (precision.quantization == "int8")
            for product in products(converted)
        )
        difference = max_logit_difference(converted, reference, ids)
        assert (difference == 0) == (precision.name == "float32")
    assert next(model.parameters()).dtype == torch.float32  # the original is left as it was

"""Lesson 01's exercises: the K/V heads in the parameter count, and how far rotary pairs turn.

Each checker builds what the question changes from the embedded model's own `config.json`
(a model on the `meta` device has shapes and no memory, so counting its parameters is
instant) and compares the learner's answer with what it counts.
"""

from __future__ import annotations

import dataclasses

import torch

from llmengine.lessons.exercises import Verdict, check_value
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.model.loader import embedded_model_path
from llmengine.model.rope import inverse_frequencies


def embedded_config(**changes: object) -> LlamaConfig:
    """The embedded model's configuration, with `changes` applied."""
    config = LlamaConfig.from_file(embedded_model_path() / "config.json")
    return dataclasses.replace(config, **changes)


def parameter_count(config: LlamaConfig) -> int:
    """The parameters of a Llama built from `config` (on `meta`: shapes only)."""
    with torch.device("meta"):
        model = Llama(config)
    return sum(parameter.numel() for parameter in model.parameters())


def pairs_turning_within_context(config: LlamaConfig) -> int:
    """Rotary channel pairs whose wavelength (`2π / θ_i` tokens) fits within the model's
    `max_position_embeddings`: the pairs that complete at least one full turn."""
    wavelengths = 2 * torch.pi / inverse_frequencies(config)
    return int((wavelengths <= config.max_position_embeddings).sum())


def check_parameters_with_two_kv_heads(answer: int | None) -> Verdict:
    """Exercise 1: the embedded model's parameter count with 2 K/V heads instead of 4."""
    expected = parameter_count(embedded_config(num_key_value_heads=2))
    return check_value(
        answer,
        expected,
        what="the parameter count with 2 K/V heads",
        explain=(
            "Only k_proj and v_proj shrink: each loses half its rows in each of the 4 layers; "
            "the query heads, the MLP and the embedding keep their size."
        ),
    )


def check_pairs_turning_with_llama3_theta(answer: int | None) -> Verdict:
    """Exercise 2: how many of the 16 rotary pairs complete a turn within 512 positions when
    `rope_theta` is Llama 3's 500,000 instead of 10,000."""
    expected = pairs_turning_within_context(embedded_config(rope_theta=500000.0))
    return check_value(
        answer,
        expected,
        what="the pairs that turn fully within 512 positions at rope_theta 500000",
        explain=(
            "A larger theta slows every pair but the first: pair i's wavelength is "
            "2π · theta^(2i/32), so fewer pairs fit a whole turn into the context."
        ),
    )

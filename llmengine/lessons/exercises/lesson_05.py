"""Lesson 05's exercises: what the cached loop computes, and what a large model's cache costs.

The first checker runs the lesson's cached generation under a `ForwardLog` and adds up the
positions; the second prices one cached position of Llama 3 70B with the lesson's
`kv_bytes_per_position`.
"""

from __future__ import annotations

import torch

from llmengine.lessons.cached_generation import generate_greedy_contiguous
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.exercises.lesson_03 import embedded_model
from llmengine.lessons.forward_log import ForwardLog
from llmengine.lessons.fragmentation import kv_bytes_per_position
from llmengine.model.config import LlamaConfig
from llmengine.model.tokenizer import load_tokenizer

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"

# Llama 3 70B's shape (config.json of meta-llama/Meta-Llama-3-70B).
LLAMA3_70B = LlamaConfig(
    vocab_size=128256,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=8192,
)


def cached_positions(generated: int) -> int:
    """Positions the contiguous-cache loop computes for the lesson's prompt and `generated`
    tokens, counted by a `ForwardLog`."""
    model = embedded_model()
    with ForwardLog(model) as log:
        generate_greedy_contiguous(model, [load_tokenizer().encode(PROMPT)], generated)
    return sum(log.positions)


def check_cached_positions_for_100_tokens(answer: int | None) -> Verdict:
    """Exercise 1: positions the cached loop computes for 100 tokens after the 19-token prompt."""
    prompt = len(load_tokenizer().encode(PROMPT))
    return check_value(
        answer,
        cached_positions(100),
        what="the positions computed with the cache for 100 tokens",
        explain=f"The prefill computes the {prompt} prompt positions, then each of 99 decodes one.",
    )


def check_llama3_70b_bytes_per_position(answer: int | None) -> Verdict:
    """Exercise 2: bytes one cached position costs Llama 3 70B in bfloat16."""
    return check_value(
        answer,
        kv_bytes_per_position(LLAMA3_70B, torch.bfloat16),
        what="the bytes per cached position of Llama 3 70B in bfloat16",
        explain=(
            "2 (a key and a value) × 80 layers × 8 K/V heads × 128 dims × 2 bytes: 320 KiB "
            "a position; the 64 query heads and the hidden size do not enter."
        ),
    )

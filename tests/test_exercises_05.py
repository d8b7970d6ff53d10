"""Lesson 05's exercise checkers: the right answer, found here another way (the formula, the
size of a one-position cache's tensors), is right; a wrong one is wrong; no answer is
unanswered."""

from __future__ import annotations

import torch

import llmengine
from llmengine.kv.contiguous_cache import ContiguousKVCache
from llmengine.lessons.exercises.lesson_05 import (
    LLAMA3_70B,
    PROMPT,
    check_cached_positions_for_100_tokens,
    check_llama3_70b_bytes_per_position,
)


def test_cached_positions_for_100_tokens() -> None:
    prompt = len(llmengine.load_tokenizer().encode(PROMPT))
    expected = prompt + 100 - 1
    assert check_cached_positions_for_100_tokens(expected).right is True
    assert check_cached_positions_for_100_tokens(100 * prompt).right is False
    assert check_cached_positions_for_100_tokens(None).right is None


def test_llama3_70b_bytes_per_position() -> None:
    # A cache of one row and one position on the meta device: shapes and dtypes, no memory.
    cache = ContiguousKVCache(LLAMA3_70B, 1, 1, dtype=torch.bfloat16, device="meta")
    expected = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert expected == 320 * 1024
    assert check_llama3_70b_bytes_per_position(expected).right is True
    assert check_llama3_70b_bytes_per_position(2 * expected).right is False  # float32
    assert check_llama3_70b_bytes_per_position(None).right is None

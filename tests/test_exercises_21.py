"""Lesson 21's exercises: each checker right on the answer the rule gives, wrong on another,
unanswered on None. The right answers are computed here from the rule (only full blocks are
shared, never the one holding the last token), not by the checkers' own engine runs."""

from __future__ import annotations

import llmengine
from llmengine.lessons.exercises.lesson_21 import (
    check_same_prompt_twice,
    check_shortest_prompt_taking,
    check_system_prompt_with_blocks_of,
)
from llmengine.lessons.prefix_sharing import SPEECHES, SYSTEM_PROMPT


def test_same_prompt_twice() -> None:
    for prompt_len, block_size in ((100, 16), (33, 8)):
        right = (prompt_len - 1) // block_size * block_size
        assert check_same_prompt_twice(right, prompt_len, block_size).right is True
        assert check_same_prompt_twice(prompt_len, prompt_len, block_size).right is False
    assert check_same_prompt_twice(None).right is None


def test_system_prompt_with_smaller_blocks() -> None:
    shared = len(llmengine.load_tokenizer().encode(SYSTEM_PROMPT))
    right = (len(SPEECHES) - 1) * (shared // 8) * 8
    assert check_system_prompt_with_blocks_of(right, 8).right is True
    assert check_system_prompt_with_blocks_of((len(SPEECHES) - 1) * shared, 8).right is False
    assert check_system_prompt_with_blocks_of(None).right is None


def test_shortest_prompt_taking_five_blocks() -> None:
    right = 5 * 8 + 1  # the last token just beyond five full blocks of 8
    assert check_shortest_prompt_taking(right, 5, 8).right is True
    assert check_shortest_prompt_taking(right - 1, 5, 8).right is False
    assert check_shortest_prompt_taking(None).right is None

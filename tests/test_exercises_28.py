"""Lesson 28's exercises: each checker right on the answer worked out here by another route
(the suffixes searched by hand, the forwards replayed from the plain greedy text, the
probability from `math.exp` after cutting to the top 3 logits), wrong on another, unanswered
on None."""

from __future__ import annotations

import math

import llmengine
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.exercises.lesson_28 import (
    LOOKUP_K,
    LOOKUP_TOKENS,
    RUN_K,
    RUN_PROMPT,
    RUN_TOKENS,
    TOY_DRAFT,
    TOY_LOGITS,
    check_forwards,
    check_keep_probability,
    check_proposal,
)
from llmengine.lessons.speculation import generate_counted, replay_guesses


def latest_match(tokens: list[int], k: int) -> list[int]:
    """Prompt lookup by brute force: every suffix length from 4 down, every earlier start
    from the right, the first match's followers."""
    for n in (4, 3, 2, 1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
        if starts:
            return tokens[max(starts) + n :][:k]
    return []


def test_proposal() -> None:
    right = latest_match(list(LOOKUP_TOKENS), LOOKUP_K)
    assert right  # the exercise has a guess to find
    assert check_proposal(right).right is True
    assert check_proposal(latest_match(list(LOOKUP_TOKENS[:4]), LOOKUP_K)).right is False
    assert check_proposal(right[:-1]).right is False
    assert check_proposal(None).right is None


def test_forwards() -> None:
    prompt = llmengine.load_tokenizer().encode(RUN_PROMPT)
    output = generate_counted(embedded_model("eager"), [prompt], RUN_TOKENS).outputs[0]
    right = 1 + len(replay_guesses(prompt, output, RUN_K))
    assert right < RUN_TOKENS  # some guess is kept
    assert check_forwards(right).right is True
    assert check_forwards(right + 1).right is False
    assert check_forwards(RUN_TOKENS).right is False
    assert check_forwards(None).right is None


def test_keep_probability() -> None:
    top3 = sorted(TOY_LOGITS, reverse=True)[:3]
    right = math.exp(TOY_LOGITS[TOY_DRAFT]) / sum(math.exp(value) for value in top3)
    assert check_keep_probability(right).right is True
    assert check_keep_probability(right * 1.005).right is True
    everything = math.exp(TOY_LOGITS[TOY_DRAFT]) / sum(math.exp(value) for value in TOY_LOGITS)
    assert check_keep_probability(everything).right is False  # top_k forgotten
    assert check_keep_probability(None).right is None

"""Lesson 04's exercise checkers: the right answer, found here by a plain sorted-list
computation over the model's probabilities, is right; a wrong one is wrong; no answer is
unanswered."""

from __future__ import annotations

import torch

import llmengine
from llmengine.lessons.exercises.lesson_04 import (
    check_a_greedy_top_p,
    check_candidates_at_temperature_quarter,
    check_top_k_then_top_p,
)

WINDOW = "ROMEO:\nBut soft, what light through yonder window"
SURE = "I pray you, good my"


def sorted_probabilities(text: str, temperature: float = 1.0) -> list[float]:
    tokenizer = llmengine.load_tokenizer()
    model = llmengine.load_model(kernels="eager")
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode(text)]))[0, -1]
    return sorted(torch.softmax(logits.double() / temperature, -1).tolist(), reverse=True)


def nucleus(probabilities: list[float], top_p: float) -> int:
    """The fewest likeliest tokens whose probabilities add up to `top_p`."""
    total = 0.0
    for count, probability in enumerate(probabilities, start=1):
        total += probability
        if total >= top_p:
            return count
    return len(probabilities)


def test_candidates_at_temperature_quarter() -> None:
    right = nucleus(sorted_probabilities(WINDOW, temperature=0.25), 0.9)
    assert right < nucleus(sorted_probabilities(WINDOW), 0.9)
    assert check_candidates_at_temperature_quarter(right).right is True
    assert check_candidates_at_temperature_quarter(len(sorted_probabilities(WINDOW))).right is False
    assert check_candidates_at_temperature_quarter(None).right is None


def test_top_k_then_top_p() -> None:
    top = sorted_probabilities(WINDOW)[:50]
    total, kept = 0.0, 0
    for probability in top:
        kept += 1
        total += probability / sum(top)
        if total >= 0.5:
            break
    assert check_top_k_then_top_p(kept).right is True
    assert check_top_k_then_top_p(kept + 1).right is False
    assert check_top_k_then_top_p(None).right is None


def test_a_greedy_top_p() -> None:
    favourite, second = sorted_probabilities(SURE)[:2]
    assert check_a_greedy_top_p(round(favourite * 0.9, 3)).right is True
    assert check_a_greedy_top_p(round(favourite + second / 2, 3)).right is False
    assert check_a_greedy_top_p(0.0).right is False  # not a valid top_p
    assert check_a_greedy_top_p(None).right is None

"""Lesson 28's exercises: each checker right on the answer worked out here by another route
(the suffixes searched by hand, the forwards replayed from the plain greedy text, the
probability from `math.exp` after cutting to the top 3 logits, the draft rule's chances from
the overlap and residual by hand and by sampling `verify_drafts`), wrong on another,
unanswered on None."""

from __future__ import annotations

import math

import torch

import llmengine
from llmengine import SamplingParams
from llmengine.lessons.draft_model import draft_outcomes
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.exercises.lesson_28 import (
    DRAFT_P,
    DRAFT_Q,
    LOOKUP_K,
    LOOKUP_TOKENS,
    REFUSAL_TOKEN,
    RUN_K,
    RUN_PROMPT,
    RUN_TOKENS,
    TOY_DRAFT,
    TOY_LOGITS,
    check_draft_kept,
    check_forwards,
    check_keep_probability,
    check_proposal,
    check_refusal_token,
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


def test_draft_rule_exercises_agree_with_verify_drafts() -> None:
    """The right answers from the overlap and residual by hand, and `verify_drafts` sampled
    on drafts drawn from q lands within a few standard errors of them."""
    right_kept = sum(min(p, q) for p, q in zip(DRAFT_P, DRAFT_Q, strict=True))
    residual = [max(p - q, 0.0) for p, q in zip(DRAFT_P, DRAFT_Q, strict=True)]
    right_token = residual[REFUSAL_TOKEN] / sum(residual)
    trials = 3000
    p_logits, q_logits = torch.tensor(DRAFT_P).log(), torch.tensor(DRAFT_Q).log()
    kept, _ = draft_outcomes(p_logits, q_logits, SamplingParams(temperature=1.0), trials)
    assert abs(kept / trials - right_kept) < 4 * math.sqrt(right_kept * (1 - right_kept) / trials)
    assert check_draft_kept(right_kept).right is True
    assert check_draft_kept(1 - right_kept).right is False  # the refusal chance
    assert check_draft_kept(DRAFT_P[1]).right is False  # p(d) alone, as if q were certain
    assert check_draft_kept(None).right is None
    assert check_refusal_token(right_token).right is True
    assert check_refusal_token(DRAFT_P[REFUSAL_TOKEN]).right is False  # drawn from p itself
    assert check_refusal_token(None).right is None

"""Lesson 28's exercises: what prompt lookup guesses, what a run with guesses costs in forwards,
and how often the sampled rule keeps a guess.

The checkers ask the engine's own code: `propose_ngram`, a greedy run of the embedded model
with n-gram speculation (forwards counted step by step), and the sampler's own distribution
(`candidate_distribution`, the one `verify_drafts` draws from); nothing is timed.
"""

from __future__ import annotations

import functools

import torch

import llmengine
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.speculation import generate_counted
from llmengine.params import SamplingParams
from llmengine.sampling import candidate_distribution
from llmengine.speculative.ngram import propose_ngram

LOOKUP_TOKENS = (5, 8, 2, 5, 8, 9, 7, 5, 8)
LOOKUP_K = 3
RUN_PROMPT = "ROMEO:\n"
RUN_TOKENS = 100
RUN_K = 2
TOY_LOGITS = (2.0, 1.0, 0.5, 0.0)
TOY_PARAMS = SamplingParams(temperature=1.0, top_k=3)
TOY_DRAFT = 1


def check_proposal(answer: list[int] | None) -> Verdict:
    """Exercise 1: the tokens `propose_ngram(LOOKUP_TOKENS, LOOKUP_K)` proposes."""
    what = f"propose_ngram({list(LOOKUP_TOKENS)}, k={LOOKUP_K})"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        list(answer),
        propose_ngram(LOOKUP_TOKENS, LOOKUP_K),
        what=what,
        explain="No suffix of 4 or 3 tokens occurs earlier; [5, 8] does, twice, and the latest "
        "occurrence wins: the tokens after it are the guess.",
    )


@functools.cache
def forwards_at(k: int = RUN_K, prompt: str = RUN_PROMPT, max_tokens: int = RUN_TOKENS) -> int:
    """Forwards of the embedded model's greedy run of `prompt` (`max_tokens` tokens, past the
    end token) alone on an engine speculating with up to `k` drafts, prefill included."""
    tokens = llmengine.load_tokenizer().encode(prompt)
    return generate_counted(embedded_model("eager"), [tokens], max_tokens, k).forwards


def check_forwards(answer: int | None) -> Verdict:
    """Exercise 2: the forwards the lesson's first stream takes at k = 2."""
    what = f"the forwards of {RUN_PROMPT!r}, {RUN_TOKENS} greedy tokens, at k = {RUN_K}"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        forwards_at(),
        what=what,
        explain="Greedy speculation writes the same text, so the count follows from that text: "
        "each forward adds the guess's agreeing prefix and one token.",
    )


def keep_probability(
    logits: tuple[float, ...] = TOY_LOGITS,
    params: SamplingParams = TOY_PARAMS,
    draft: int = TOY_DRAFT,
) -> float:
    """p(draft) under the sampler's distribution for `logits` and `params`: the chance that
    `verify_drafts` keeps the draft."""
    tokens, probs = candidate_distribution(torch.tensor(logits), params)
    return float(probs[tokens == draft].sum())


def check_keep_probability(answer: float | None) -> Verdict:
    """Exercise 3: the chance the sampled rule keeps the toy draft (to within 1%)."""
    what = f"the chance of keeping draft {TOY_DRAFT} under logits {list(TOY_LOGITS)}, top_k=3"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        keep_probability(),
        what=what,
        tolerance=0.01,
        explain="top_k=3 drops the last token before the softmax, so p(1) = e^1 / (e^2 + e^1 + "
        "e^0.5); the rule keeps the draft with exactly that chance.",
    )

"""Lesson 28's exercises: what prompt lookup guesses, what a run with guesses costs in forwards,
how often the sampled rule keeps a guess, and what it does with a draft model's.

The checkers ask the engine's own code: `propose_ngram`, a greedy run of the embedded model
with n-gram speculation (forwards counted step by step), the sampler's own distribution
(`candidate_distribution`, the one `verify_drafts` draws from), and, for a draft drawn from
a distribution q, the chances `verify_drafts`'s rule gives; nothing is timed.
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


DRAFT_Q = (0.2, 0.6, 0.1, 0.1)  # the draft model's distribution
DRAFT_P = (0.5, 0.3, 0.15, 0.05)  # the target's
REFUSAL_TOKEN = 0


def draft_kept_probability(p: tuple[float, ...] = DRAFT_P, q: tuple[float, ...] = DRAFT_Q) -> float:
    """The chance `verify_drafts` keeps a draft drawn from q: each draft d comes with
    probability q(d) and is kept with probability min(1, p(d) / q(d))."""
    return sum(qd * min(1.0, pd / qd) for pd, qd in zip(p, q, strict=True) if qd > 0)


def refusal_distribution(
    p: tuple[float, ...] = DRAFT_P, q: tuple[float, ...] = DRAFT_Q
) -> list[float]:
    """What a refusal draws from: the positive part of p - q, renormalised."""
    residual = [max(pd - qd, 0.0) for pd, qd in zip(p, q, strict=True)]
    return [share / sum(residual) for share in residual]


def check_draft_kept(answer: float | None) -> Verdict:
    """Exercise 4: the chance a draft drawn from DRAFT_Q is kept against DRAFT_P (within 1%)."""
    what = (
        f"the chance of keeping a draft drawn from q = {list(DRAFT_Q)} against p = {list(DRAFT_P)}"
    )
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        draft_kept_probability(),
        what=what,
        tolerance=0.01,
        explain="Summed over the drafts d, q(d) · min(1, p(d) / q(d)) = Σ min(p(d), q(d)): the "
        "overlap of the two distributions.",
    )


def check_refusal_token(answer: float | None) -> Verdict:
    """Exercise 5: the chance a refusal writes token REFUSAL_TOKEN (within 1%)."""
    what = f"the chance a refusal writes token {REFUSAL_TOKEN}"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        refusal_distribution()[REFUSAL_TOKEN],
        what=what,
        tolerance=0.01,
        explain="A refusal draws from (p - q)+ renormalised: only the tokens where p exceeds q, "
        "in proportion to how much it exceeds it.",
    )

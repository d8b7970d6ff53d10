"""Lesson 04's exercises: what temperature leaves, what top-k and top-p leave together, and a
top-p that makes sampling greedy.

The checkers score the lesson's two contexts with the embedded model and run the sampler's
own `candidate_distribution` on them, as the lesson does.
"""

from __future__ import annotations

from typing import Any

import torch

from llmengine.lessons.exercises import Verdict, check_value, check_with
from llmengine.lessons.exercises.lesson_03 import embedded_model
from llmengine.model.tokenizer import load_tokenizer
from llmengine.sampling import SamplingParams, candidate_distribution

WINDOW = "ROMEO:\nBut soft, what light through yonder window"
SURE = "I pray you, good my"


def next_token_logits(text: str) -> torch.Tensor:
    """The embedded model's logits for the token after `text`."""
    with torch.no_grad():
        return embedded_model()(torch.tensor([load_tokenizer().encode(text)]))[0, -1]


def candidates(text: str, **knobs: Any) -> int:
    """How many tokens a draw after `text` may still pick with `knobs` (temperature 1 unless
    given)."""
    params = SamplingParams(**{"temperature": 1.0, **knobs})
    return len(candidate_distribution(next_token_logits(text), params)[1])


def check_candidates_at_temperature_quarter(answer: int | None) -> Verdict:
    """Exercise 1: candidates `top_p=0.9` leaves after "...yonder window" at temperature 0.25."""
    return check_value(
        answer,
        candidates(WINDOW, temperature=0.25, top_p=0.9),
        what="the candidates top_p 0.9 leaves at temperature 0.25",
        explain="Temperature divides the logits before top-p sees them: at 0.25 the few likeliest "
        "tokens hold nearly all the probability, so 90% of it is reached after a handful.",
    )


def check_top_k_then_top_p(answer: int | None) -> Verdict:
    """Exercise 2: candidates left after "...yonder window" with top_k 50 and top_p 0.5."""
    alone = candidates(WINDOW, top_p=0.5)
    return check_value(
        answer,
        candidates(WINDOW, top_k=50, top_p=0.5),
        what="the candidates with top_k 50 and top_p 0.5",
        explain=(
            "Top-k runs first and renormalises: each of the 50 kept tokens then holds a larger "
            f"share, so fewer of them reach half the mass than the {alone} top-p 0.5 keeps "
            "alone."
        ),
    )


def check_a_greedy_top_p(answer: float | None) -> Verdict:
    """Exercise 3: a `top_p` that leaves one candidate after "I pray you, good my"."""

    def judge(top_p: float) -> tuple[bool, str]:
        try:
            kept = candidates(SURE, top_p=top_p)
        except ValueError as error:
            return False, f"top_p {top_p!r} is not a valid setting: {error}."
        if kept == 1:
            favourite = load_tokenizer().decode([int(next_token_logits(SURE).argmax())])
            return True, (
                f"top_p {top_p!r} keeps only {favourite!r}: its probability alone reaches "
                f"{top_p!r}, so the draw has one candidate, the one greedy picks."
            )
        return False, f"top_p {top_p!r} keeps {kept} candidates, not 1."

    return check_with(answer, judge, what="a top_p that makes sampling greedy here")

"""Lesson 06's exercises: what one row of a contiguous cache fills, and what share of a smaller
reservation the lesson's batch fills.

The checkers run the lesson's `generate_greedy_contiguous` on the embedded model and read the
cache's own `lengths`, as the lesson does.
"""

from __future__ import annotations

import llmengine
from llmengine.lessons.cached_generation import generate_greedy_contiguous
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.exercises.lesson_03 import embedded_model
from llmengine.model.tokenizer import load_tokenizer

LINE = "ROMEO:\nBut soft, what light through yonder window breaks?"


def lesson_batch() -> tuple[list[list[int]], list[int]]:
    """The lesson's 8 requests: prompts and budgets from `mixed_workload`, seed 6."""
    workload = llmengine.mixed_workload(
        8,
        prompt_lens=(4, 64),
        budgets=(8, 96),
        vocab_size=embedded_model().config.vocab_size,
        seed=6,
    )
    return [list(spec.prompt_token_ids) for spec in workload], [
        spec.params.max_tokens for spec in workload
    ]


def filled_share(max_seq_len: int) -> float:
    """Filled positions over reserved ones when the lesson's batch runs with rows of
    `max_seq_len` positions."""
    prompts, budgets = lesson_batch()
    _, cache = generate_greedy_contiguous(embedded_model(), prompts, budgets, max_seq_len)
    return sum(cache.lengths) / (max_seq_len * len(prompts))


def check_filled_positions_of_one_row(answer: int | None) -> Verdict:
    """Exercise 1: the positions a row fills for a 10-token prompt and 20 generated tokens."""
    prompt = load_tokenizer().encode(LINE)[:10]
    _, cache = generate_greedy_contiguous(embedded_model(), [prompt], 20, max_seq_len=512)
    return check_value(
        answer,
        cache.lengths[0],
        what="the positions filled by a 10-token prompt and 20 tokens",
        explain="The prompt, plus every generated token but the last, which is never fed back.",
    )


def check_filled_share_at_256(answer: float | None) -> Verdict:
    """Exercise 2: the share of the reserved positions the lesson's batch fills with rows of
    256 positions, as a fraction (within 2% of it)."""
    return check_value(
        answer,
        round(filled_share(256), 3),
        what="the filled share with rows of 256 positions",
        tolerance=0.02,
        explain=(
            "The rows fill the same positions whatever is reserved; halving the reservation "
            "doubles the share of it they fill."
        ),
    )

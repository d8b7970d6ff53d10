"""Lesson 09's exercises: the rows a static batch computes, the rows the engine computes, and
what more slots do to a queue.

Each checker runs lesson 09's workload shape (a burst of 5-token prompts with the budgets
given) through `run_static_batches` or the engine on the embedded model and counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value, embedded_model

PROMPT_TOKENS, BLOCK_SIZE = 5, 4


def _burst(budgets: Sequence[int], seed: int = 29) -> list[RequestSpec]:
    import llmengine

    burst = llmengine.uniform_burst(
        len(budgets), PROMPT_TOKENS, 1, vocab_size=embedded_model().config.vocab_size, seed=seed
    )
    return llmengine.with_budgets(burst, list(budgets))


def static_rows(budgets: Sequence[int], num_slots: int = 8) -> int:
    """Rows the static runner computes for a burst with these budgets."""
    import llmengine

    run = llmengine.run_static_batches(embedded_model(), _burst(budgets), num_slots=num_slots)
    return sum(run.timing().rows)


def engine_rows(budgets: Sequence[int], num_slots: int = 8) -> int:
    """Rows the engine computes for the same burst, its pool roomy enough never to wait."""
    import llmengine

    blocks = sum(-(-(PROMPT_TOKENS + budget) // BLOCK_SIZE) for budget in budgets)
    engine = llmengine.Engine(
        embedded_model(), num_blocks=blocks, block_size=BLOCK_SIZE, num_slots=num_slots
    )
    return sum(llmengine.run_workload(engine, _burst(budgets)).timing().rows)


def check_static_rows(
    answer: int | None, budgets: Sequence[int] = (20, 4, 4, 4, 4, 4, 4, 4)
) -> Verdict:
    """How many rows the static runner computes for a burst of these budgets in eight slots."""
    if answer is None:
        return check_value(None, None, what="the rows the static batch computes")
    return check_value(
        answer,
        static_rows(budgets),
        what="the rows the static batch computes",
        explain="Every forward computes a row for every request in the rectangle, finished or "
        "not, until the longest budget is spent.",
    )


def check_engine_rows(
    answer: int | None, budgets: Sequence[int] = (20, 4, 4, 4, 4, 4, 4, 4)
) -> Verdict:
    """How many rows the engine computes for the same burst."""
    if answer is None:
        return check_value(None, None, what="the rows the engine computes")
    return check_value(
        answer,
        engine_rows(budgets),
        what="the rows the engine computes",
        explain="The engine computes a row only for a live request: one row per token kept.",
    )


def check_static_iterations_with_slots(answer: int | None, num_slots: int = 16) -> Verdict:
    """Forwards the static runner takes for the queued workload (the burst twice) with
    `num_slots` slots."""
    if answer is None:
        return check_value(
            None, None, what=f"the static runner's iterations with {num_slots} slots"
        )
    import llmengine

    budgets = [32] + [4] * 7
    queued = _burst(budgets * 2, seed=30)
    run = llmengine.run_static_batches(embedded_model(), queued, num_slots=num_slots)
    return check_value(
        answer,
        run.timing().iterations,
        what=f"the static runner's iterations with {num_slots} slots",
        explain="Each rectangle takes as many forwards as its longest request has tokens, and "
        "the next one starts only when it is done.",
    )

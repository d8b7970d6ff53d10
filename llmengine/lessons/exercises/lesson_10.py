"""Lesson 10's exercises: the largest budget the door lets in, and when a waiting request
finishes once it has more slots.

The door is asked through `Scheduler.add`, the same check `Engine.add_request` makes; the finish
is read from the `IterationOutcome`s of an engine run on the embedded model.
"""

from __future__ import annotations

from llmengine.lessons.exercises import Verdict, check_value, embedded_model

OLDER_PROMPT, YOUNGER_PROMPT = [11, 12, 13, 14, 15], [21, 22, 23, 24, 25]


def _passes_the_door(prompt_tokens: int, budget: int, num_blocks: int, block_size: int) -> bool:
    import llmengine
    from llmengine.scheduling.request import Request

    scheduler = llmengine.Scheduler(num_blocks=num_blocks, block_size=block_size, num_slots=1)
    request = Request(
        request_id=0,
        prompt_token_ids=list(range(1, prompt_tokens + 1)),
        params=llmengine.SamplingParams(max_tokens=budget, ignore_eos=True),
        arrival=0,
        block_size=block_size,
    )
    try:
        scheduler.add(request)
    except ValueError:
        return False
    return True


def largest_budget_through_the_door(prompt_tokens: int, num_blocks: int, block_size: int) -> int:
    """The largest budget the door accepts with this prompt (0 when none does)."""
    budget = 0
    while _passes_the_door(prompt_tokens, budget + 1, num_blocks, block_size):
        budget += 1
    return budget


def check_largest_budget(
    answer: int | None, prompt_tokens: int = 5, num_blocks: int = 8, block_size: int = 4
) -> Verdict:
    """The largest budget a request with this prompt can ask for and still be added."""
    expected = largest_budget_through_the_door(prompt_tokens, num_blocks, block_size)
    return check_value(
        answer,
        expected,
        what="the largest budget the door lets in",
        explain=(
            f"The empty pool holds {num_blocks * block_size} positions; the prompt takes "
            f"{prompt_tokens} of them, and the door counts the whole budget on top."
        ),
    )


def younger_finishes_at(num_slots: int, budget: int) -> int:
    """The iteration in which the younger of the lesson's two requests finishes."""
    import llmengine

    params = llmengine.SamplingParams(max_tokens=budget, ignore_eos=True)
    blocks = 2 * llmengine.blocks_for_length(len(OLDER_PROMPT) + budget, 4)
    engine = llmengine.Engine(
        embedded_model(), num_blocks=blocks, block_size=4, num_slots=num_slots
    )
    engine.add_request(OLDER_PROMPT, params)
    younger = engine.add_request(YOUNGER_PROMPT, params)
    iteration = 0
    while engine.has_unfinished():
        iteration += 1
        if younger in engine.step().finished:
            return iteration
    raise AssertionError("the younger request never finished")


def check_finish_iteration(answer: int | None, num_slots: int = 2, budget: int = 8) -> Verdict:
    """In which iteration request 1 finishes, with `num_slots` slots and budgets of `budget`."""
    if answer is None:
        return check_value(None, None, what="the iteration in which request 1 finishes")
    return check_value(
        answer,
        younger_finishes_at(num_slots, budget),
        what="the iteration in which request 1 finishes",
        explain="A running request gets one token from every forward; it waits only while no "
        "slot is free.",
    )

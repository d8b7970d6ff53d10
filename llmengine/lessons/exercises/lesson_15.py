"""Lesson 15's exercises: blocks at a block boundary, the door's last budget, a pool that never
evicts. Each check runs the engine on the embedded model to find the right answer."""

from __future__ import annotations

import llmengine
from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine
from llmengine.lessons.exercises import Verdict, check_value, check_with, embedded_model
from llmengine.lessons.stress import run_stress
from llmengine.sampling import SamplingParams

BLOCK_SIZE, SLOTS = 4, 6
SPEAKERS = ["ROMEO", "JULIET", "HAMLET", "KING LEAR", "MACBETH", "PORTIA"]
SPEAKERS += ["OTHELLO", "PROSPERO", "BRUTUS", "ANTONY", "HENRY V", "ORSINO"]
FIRST_TWELVE = 12


def params_for(index: int) -> SamplingParams:
    """The lesson's budgets (16 to 32, no early stop), every third request sampled and seeded."""
    budget = 16 + 7 * index % 17
    if index % 3:
        return SamplingParams(max_tokens=budget, ignore_eos=True)
    return SamplingParams(max_tokens=budget, temperature=0.8, seed=index, ignore_eos=True)


def first_twelve() -> list[RequestSpec]:
    """The first twelve requests of the lesson's workload: every speaker, opening word "O"."""
    tokenizer = llmengine.load_tokenizer()
    prompts = [tokenizer.encode(f"{speaker}:\nO") for speaker in SPEAKERS]
    return [RequestSpec(tuple(prompt), params_for(i)) for i, prompt in enumerate(prompts)]


def blocks_held(prompt_length: int) -> tuple[int, int]:
    """Blocks one request holds in its prefill's forward and in its first decode's forward."""
    engine = Engine(embedded_model(), num_blocks=16, block_size=BLOCK_SIZE, num_slots=2)
    engine.add_request(list(range(2, 2 + prompt_length)), SamplingParams(max_tokens=4))
    prefill, first_decode = engine.step(), engine.step()
    return prefill.held_blocks, first_decode.held_blocks


def check_blocks_for_an_eleven_token_prompt(answer: tuple[int, int] | None) -> Verdict:
    """Exercise 1: (blocks held in the prefill, blocks held from the first decode), 11 tokens."""
    return check_value(
        answer,
        blocks_held(11),
        what="(blocks in the prefill, blocks from the first decode) for an 11-token prompt",
        explain="The prefill writes positions 0 to 10, three blocks of 4; the first decode "
        "writes position 11, the last slot of the third block, so no fourth block yet.",
    )


def largest_budget_through_the_door(prompt_length: int, num_blocks: int) -> int:
    """The largest `max_tokens` that `add_request` accepts, found by asking the engine."""
    engine = Engine(embedded_model(), num_blocks=num_blocks, block_size=BLOCK_SIZE, num_slots=2)
    prompt = list(range(2, 2 + prompt_length))
    budget = 0
    while True:
        try:
            engine.add_request(prompt, SamplingParams(max_tokens=budget + 1, ignore_eos=True))
        except ValueError:
            return budget
        budget += 1


def check_largest_budget_through_the_door(answer: int | None) -> Verdict:
    """Exercise 2: the largest budget a 7-token prompt may ask for in a pool of 6 blocks of 4."""
    prompt_length, num_blocks = 7, 6
    budget = largest_budget_through_the_door(prompt_length, num_blocks)
    return check_value(
        answer,
        budget,
        what="the largest max_tokens the door accepts (7-token prompt, 6 blocks of 4)",
        explain=f"The door compares prompt plus budget with the empty pool: {prompt_length} + "
        f"{budget} = {prompt_length + budget} positions, {num_blocks} blocks of {BLOCK_SIZE}.",
    )


def evictions_in(num_blocks: int) -> int | None:
    """Evictions of the first twelve requests through `num_blocks` blocks and 6 slots, or None
    when the door refuses one of them."""
    try:
        run = run_stress(
            embedded_model(),
            first_twelve(),
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            num_slots=SLOTS,
        )
    except ValueError:
        return None
    return run.num_evictions


def check_smallest_pool_without_evictions(answer: int | None) -> Verdict:
    """Exercise 3: the smallest pool in which the first twelve requests run with no eviction."""

    def judge(pool: int) -> tuple[bool, str]:
        here = evictions_in(pool)
        if here is None:
            return False, f"With {pool} blocks the door refuses a request."
        if here:
            return False, f"With {pool} blocks the run evicts {_times(here)}: too small."
        one_less = evictions_in(pool - 1)
        if one_less == 0:
            return False, f"{pool} blocks evict nobody, but {pool - 1} blocks do not either."
        fewer = "refuse a request" if one_less is None else f"evict {_times(one_less)}"
        return True, (
            f"{pool} blocks evict nobody, and {pool - 1} blocks {fewer}: a pool without "
            "evictions holds what the six running requests grow into at once."
        )

    return check_with(answer, judge, what="the smallest pool without evictions")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"

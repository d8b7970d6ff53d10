"""Lesson 30's exercises: what block-granular prefix reuse hands a prompt, and what a pool
holds.

Each checker runs the engine on the embedded model (eager kernels: the kernels change the
time of a step, never which blocks are shared or how many bytes a block holds) and reads the
answer from what it reports: `cached_tokens` for the positions taken from the cache, the
pool's bytes per block for its size.
"""

from __future__ import annotations

from functools import cache

import torch

import llmengine
from llmengine.lessons.engine_contrasts import (
    PROMPT_SEED,
    run_one_after_another,
    shared_prefix_run,
)
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.runner.loading import load_model

MIB = 1 << 20


def check_shared_prefix(
    answer: int | None, shared: int = 45, own: int = 15, block_size: int = 8
) -> Verdict:
    """Exercise 1: the positions the second of two prompts sharing `shared` tokens takes."""
    if answer is None:
        return check_value(None, None, what="the positions the second prompt takes")
    run = shared_prefix_run(embedded_model("eager"), shared, own, block_size)
    return check_value(
        answer,
        run.taken,
        what=f"the positions taken by a {shared + own}-token prompt sharing {shared} tokens "
        f"(blocks of {block_size})",
        explain="Only whole blocks inside the shared prefix are shared: "
        f"{shared} // {block_size} blocks of {block_size}. A token-granular cache would hand "
        f"over all {shared}.",
    )


@cache
def second_turn_taken(first_prompt: int, generated: int, new: int, block_size: int) -> int:
    """A conversation's second turn: the first prompt, the model's greedy answer to it and
    `new` tokens more, sent after the first turn has finished. The positions it takes."""
    model = embedded_model("eager")
    generator = torch.Generator().manual_seed(PROMPT_SEED)
    first = torch.randint(3, model.config.vocab_size, (first_prompt,), generator=generator)
    answer = llmengine.generate_tokens(
        model,
        first.tolist(),
        llmengine.SamplingParams(max_tokens=generated, temperature=0.0, ignore_eos=True),
    )
    follow_up = torch.randint(3, model.config.vocab_size, (new,), generator=generator)
    second = [*first.tolist(), *answer, *follow_up.tolist()]
    outcomes = run_one_after_another(model, [first.tolist(), second], block_size, generated)
    return sum(outcome.cached_tokens for outcome in outcomes)


def check_second_turn(
    answer: int | None,
    first_prompt: int = 40,
    generated: int = 20,
    new: int = 10,
    block_size: int = 16,
) -> Verdict:
    """Exercise 2: what the second turn of a conversation takes from the first's blocks."""
    if answer is None:
        return check_value(None, None, what="the positions the second turn takes")
    return check_value(
        answer,
        second_turn_taken(first_prompt, generated, new, block_size),
        what=f"the positions the second turn takes (blocks of {block_size})",
        explain="The first turn wrote K/V for its prompt and every generated token but the "
        f"last: {first_prompt + generated - 1} positions, of which only the full blocks are "
        "cached.",
    )


def pool_blocks_in(budget_mib: float, block_size: int, dtype: str) -> int:
    """How many blocks of `block_size` tokens the embedded model's pool fits in the budget,
    from the bytes the engine's pool spends per block."""
    engine = llmengine.Engine(
        load_model(dtype=dtype, kernels="eager"), num_blocks=1, block_size=block_size, num_slots=1
    )
    return int(budget_mib * MIB) // engine.runner.cache.bytes_per_block


def check_blocks_in_budget(
    answer: int | None, budget_mib: float = 1, block_size: int = 16, dtype: str = "bfloat16"
) -> Verdict:
    """Exercise 3: the blocks a memory budget holds for the embedded model."""
    if answer is None:
        return check_value(None, None, what="the blocks the budget holds")
    return check_value(
        answer,
        pool_blocks_in(budget_mib, block_size, dtype),
        what=f"the {dtype} blocks of {block_size} tokens in {budget_mib:g} MiB",
        explain="A block holds block_size tokens of K/V, and a token costs 2 x layers x K/V "
        "heads x head_dim values of its dtype's bytes.",
    )

"""Lesson 21's exercises: how many prompt positions a prefix cache hands out, and why.

Each checker runs the engine with prefix caching on the embedded model (eager kernels: the
kernels change the time of a step, never which blocks are shared) and counts the positions
the steps report in `cached_tokens`.
"""

from __future__ import annotations

from functools import cache

import llmengine
from llmengine.bench.batchbench import run_workload
from llmengine.bench.workloads import RequestSpec, uniform_burst
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.prefix_sharing import SYSTEM_PROMPT, system_prompt_workload


@cache
def _tokenizer():
    return llmengine.load_tokenizer()


def cached_positions(workload: list[RequestSpec], *, block_size: int, num_slots: int = 8) -> int:
    """Prompt positions taken from the cache over a whole run of `workload`, on a pool roomy
    enough that no cached block is ever handed out again."""
    blocks = sum(
        -(-(len(s.prompt_token_ids) + s.params.max_tokens) // block_size) for s in workload
    )
    engine = llmengine.Engine(
        embedded_model("eager"),
        num_blocks=blocks,
        block_size=block_size,
        num_slots=num_slots,
        enable_prefix_caching=True,
    )
    return sum(outcome.cached_tokens for outcome in run_workload(engine, workload).outcomes)


@cache
def same_prompt_twice_hits(prompt_len: int, block_size: int) -> int:
    """Two requests with one seeded `prompt_len`-token prompt, admitted together, one token
    each: the positions the second takes from the first's blocks."""
    prompt = uniform_burst(
        1, prompt_len, 1, vocab_size=embedded_model("eager").config.vocab_size, seed=21
    )
    return cached_positions(prompt * 2, block_size=block_size)


def check_same_prompt_twice(
    answer: int | None, prompt_len: int = 100, block_size: int = 16
) -> Verdict:
    """Exercise 1: the cache hits of the second of two identical prompts."""
    if answer is None:
        return check_value(None, None, what="the positions the second request takes")
    return check_value(
        answer,
        same_prompt_twice_hits(prompt_len, block_size),
        what=f"the positions the second {prompt_len}-token prompt takes (blocks of {block_size})",
        explain="Only full blocks are shared, and never the one holding the last token: "
        "(prompt - 1) // block_size full blocks are taken.",
    )


@cache
def system_prompt_hits(block_size: int) -> int:
    """The lesson's sixteen system-prompt requests, run with blocks of `block_size`."""
    # One token each: how much of a prompt is taken does not depend on the budgets.
    workload = system_prompt_workload(_tokenizer(), budgets=(1, 1))
    return cached_positions(workload, block_size=block_size)


def check_system_prompt_with_blocks_of(answer: int | None, block_size: int = 8) -> Verdict:
    """Exercise 2: the sixteen requests behind the 75-token system prompt, smaller blocks."""
    if answer is None:
        return check_value(None, None, what="the cached positions of the whole run")
    shared = len(_tokenizer().encode(SYSTEM_PROMPT))
    return check_value(
        answer,
        system_prompt_hits(block_size),
        what=f"the cached positions of the sixteen requests with blocks of {block_size}",
        explain=f"Fifteen requests each take the {shared // block_size} blocks that the "
        f"{shared} shared tokens fill: smaller blocks waste less of the shared prefix.",
    )


def shortest_prompt_taking(blocks: int, block_size: int = 16) -> int:
    """The shortest prompt whose second copy takes `blocks` full blocks, found by running the
    engine: a bisection over prompt lengths, since a longer prompt never takes fewer."""
    wanted = blocks * block_size
    low, high = 1, min(2 * wanted, embedded_model("eager").config.max_position_embeddings - 1)
    if same_prompt_twice_hits(high, block_size) < wanted:
        raise ValueError(f"no prompt within the context takes {blocks} blocks of {block_size}")
    while high - low > 1:
        middle = (low + high) // 2
        if same_prompt_twice_hits(middle, block_size) >= wanted:
            high = middle
        else:
            low = middle
    return high


def check_shortest_prompt_taking(
    answer: int | None, blocks: int = 5, block_size: int = 8
) -> Verdict:
    """Exercise 3: the shortest prompt whose second copy takes `blocks` blocks."""
    if answer is None:
        return check_value(None, None, what="the shortest prompt")
    return check_value(
        answer,
        shortest_prompt_taking(blocks, block_size),
        what=f"the shortest prompt whose second copy takes {blocks} blocks of {block_size}",
        explain=f"{blocks} full blocks are {block_size * blocks} positions, and the block "
        "holding the last token is computed, never taken: the last token must lie beyond them.",
    )

"""Lesson 22's exercises: what a budget does to the long prompt, read from a run of the engine.

The checkers run the lesson's workload on the embedded model (eager kernels: the kernels change
how long a step takes, never what it computes): four short requests decoding, the 384-token
prompt arriving after 16 forwards. The long prompt asks for a single token and the short ones
for 32, enough for them to be decoding through the whole prefill, so a run takes a few dozen
small steps. What is counted is read from the run with the lesson's own readings.
"""

from __future__ import annotations

from functools import cache

import llmengine
from llmengine.bench.batchbench import WorkloadRun
from llmengine.lessons.chunked_prefill import (
    first_token_iteration,
    kv_positions_gathered,
    long_prompt_arrives,
    prefill_chunks,
)
from llmengine.lessons.exercises import Verdict, check_value

ARRIVAL, LONG = 16, 4  # the long prompt arrives after 16 forwards; the workload's last request


@cache
def budget_run(budget: int | None) -> WorkloadRun:
    """The exercises' workload under `max_num_batched_tokens=budget`, on the lesson's engine
    (64 blocks of 16, eight slots)."""
    model = llmengine.load_model(kernels="eager")
    workload = long_prompt_arrives(model.config.vocab_size, ARRIVAL, short_budget=32, long_budget=1)
    engine = llmengine.Engine(
        model, num_blocks=64, block_size=16, num_slots=8, max_num_batched_tokens=budget
    )
    return llmengine.run_workload(engine, workload)


def check_chunks(answer: int | None, budget: int = 48) -> Verdict:
    """Exercise 1: how many chunks the long prompt is computed in."""
    if answer is None:
        return check_value(None, None, what="the number of chunks")
    chunks = prefill_chunks(budget_run(budget), LONG)
    return check_value(
        answer,
        len(chunks),
        what=f"the long prompt's chunks under a budget of {budget}",
        explain=f"The four decodes take their positions first; the prompt gets the rest of "
        f"each step: {' + '.join(map(str, chunks))}.",
    )


def check_first_token_iteration(answer: int | None, budget: int = 48) -> Verdict:
    """Exercise 2: the forward that gives the long prompt its first token."""
    if answer is None:
        return check_value(None, None, what="the iteration of the first token")
    return check_value(
        answer,
        first_token_iteration(budget_run(budget), LONG),
        what=f"the long prompt's first token's iteration under a budget of {budget}",
        explain=f"It arrives after forward {ARRIVAL}, and only the chunk that reaches its last "
        "position samples: one forward per chunk.",
    )


def check_kv_reads(answer: int | None, budget: int = 48) -> Verdict:
    """Exercise 3: the cached K/V positions the long prompt's chunks read, all together."""
    if answer is None:
        return check_value(None, None, what="the K/V positions read")
    return check_value(
        answer,
        kv_positions_gathered(prefill_chunks(budget_run(budget), LONG)),
        what=f"the K/V positions the chunks read under a budget of {budget}",
        explain="Each chunk attends to every position up to its own end, so the reads are "
        "the sum of the chunks' ends.",
    )

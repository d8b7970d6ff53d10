"""Lesson 20's exercises: what the server's engine does with the lesson's burst, and the limit
the server puts on one request.

The schedule questions run the engine offline on the iteration clock, where the answer is a
count that does not depend on the machine; the HTTP question asks an in-process server on
the embedded model.
"""

from __future__ import annotations

from functools import cache

import httpx

import llmengine
from llmengine.bench.batchbench import WorkloadRun, run_workload
from llmengine.bench.workloads import uniform_burst
from llmengine.lessons.exercises import Verdict, check_value, check_with, embedded_model

# The lesson's burst: 24 requests with 32-token prompts and 48 tokens each, ids below 1,000.
REQUESTS, PROMPT_LEN, BUDGET, SEED = 24, 32, 48, 20
BLOCK_SIZE = 16
CRAMPED_BLOCKS, CRAMPED_SLOTS = 24, 8
LONG_BUDGET = 100
CHOICES_N = 8
MODEL_NAME = "tiny-shakespeare"


@cache
def burst_run(
    requests: int = REQUESTS, budget: int = BUDGET, *, num_blocks: int = 256, **options: object
) -> WorkloadRun:
    """The lesson's burst (or a variant) through one engine, on the iteration clock; the runs
    are deterministic, so each is made once and kept."""
    burst = uniform_burst(requests, PROMPT_LEN, budget, vocab_size=1000, seed=SEED)
    engine = llmengine.Engine(
        embedded_model(), num_blocks=num_blocks, block_size=BLOCK_SIZE, **options
    )
    return run_workload(engine, burst)


def waves(run: WorkloadRun) -> int:
    """The steps in which requests were admitted: one wave of first tokens each."""
    return sum(1 for outcome in run.outcomes if outcome.admitted)


def check_waves_with_slots(answer: int | None, slots: int = 6) -> Verdict:
    """The waves the 24-request burst is served in, on a roomy pool with `slots` slots."""
    if answer is None:
        return check_value(None, None, what="the waves")
    run = burst_run(num_slots=slots)
    return check_value(
        answer,
        waves(run),
        what=f"the waves of the burst with {slots} slots",
        explain=(
            "Requests with equal prompts and budgets finish together, so a wave of new ones is "
            "admitted only when the whole previous wave is done."
        ),
    )


def most_running(run: WorkloadRun) -> int:
    """The most rows any step of the run computed: requests running at once."""
    return max(outcome.rows for outcome in run.outcomes)


def check_reserve_with_longer_budgets(answer: int | None) -> Verdict:
    """Requests running at once at most under `policy="reserve"` on the cramped 24-block pool
    with eight slots, when every request asks for 100 tokens instead of 48."""
    if answer is None:
        return check_value(None, None, what="the requests running at once")
    run = burst_run(
        6,
        LONG_BUDGET,
        num_blocks=CRAMPED_BLOCKS,
        num_slots=CRAMPED_SLOTS,
        policy="reserve",
    )
    worst = llmengine.blocks_for_length(PROMPT_LEN + LONG_BUDGET, BLOCK_SIZE)
    return check_value(
        answer,
        most_running(run),
        what=f"the most requests running at once with {LONG_BUDGET}-token budgets",
        explain=(
            f"Reserve admits a request only when its worst case, {worst} blocks, is free: the "
            f"slots are not the limit, the {CRAMPED_BLOCKS}-block pool is."
        ),
    )


def status_for_prompts(url: str, prompts: int, n: int = CHOICES_N) -> int:
    """The HTTP status of one completion request carrying `prompts` one-token prompts x `n`."""
    body = {
        "model": MODEL_NAME,
        "prompt": [[1]] * prompts,
        "n": n,
        "max_tokens": 1,
        "temperature": 0,
    }
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code


def check_most_prompts_in_one_request(answer: int | None) -> Verdict:
    """The most prompts one request with `n` = 8 may carry and still be answered: the server
    must answer that many with 200 and one more with 400."""
    from llmengine.server import create_app, serve_in_thread

    def judge(prompts: int) -> tuple[bool, str]:
        if prompts < 1:
            return False, f"a request needs at least one prompt, not {prompts}."
        engine = llmengine.Engine(
            embedded_model(), num_blocks=64, block_size=BLOCK_SIZE, num_slots=64
        )
        app = create_app(engine, llmengine.load_tokenizer(), served_model_name=MODEL_NAME)
        with serve_in_thread(app) as url:
            at, above = status_for_prompts(url, prompts), status_for_prompts(url, prompts + 1)
        observed = (
            f"{prompts} prompts x n={CHOICES_N}: status {at}; "
            f"{prompts + 1} prompts: status {above}."
        )
        return (at, above) == (200, 400), observed

    return check_with(answer, judge, what="the most prompts with n=8")

"""Lesson 19's exercises: the work each engine is asked to do, counted on the embedded model.

The lesson's speeds are wall-clock measurements and move from run to run, so the exercises ask
about what does not: positions computed, rows computed for nobody, operators launched.
"""

from __future__ import annotations

from collections.abc import Sequence

import llmengine
from llmengine.bench import throughput
from llmengine.bench.batchbench import run_workload
from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value, embedded_model

BLOCK_SIZE = 16
LESSON_ROWS = 16  # the rows of the lesson's decode step
STAIRCASE_BUDGETS = tuple(range(4, 33, 4))  # 4, 8, ..., 32


def mixed_workload() -> list[RequestSpec]:
    """The lesson's mixed workload: 16 requests, prompts of 4 to 48 tokens, budgets 4 to 64."""
    return llmengine.mixed_workload(
        16,
        prompt_lens=(4, 48),
        budgets=(4, 64),
        vocab_size=embedded_model().config.vocab_size,
        seed=15,
    )


def staircase_workload() -> list[RequestSpec]:
    """Eight requests with 16-token prompts and budgets 4, 8, ..., 32."""
    vocab_size = embedded_model().config.vocab_size
    return [
        spec
        for seed, budget in enumerate(STAIRCASE_BUDGETS)
        for spec in llmengine.uniform_burst(1, 16, budget, vocab_size=vocab_size, seed=seed)
    ]


def _engine(workload: Sequence[RequestSpec], rows: int | None = None) -> llmengine.Engine:
    """An engine with a slot per request and a pool for every request's worst case."""
    return llmengine.Engine(
        embedded_model(),
        num_blocks=throughput.pool_blocks(workload, BLOCK_SIZE),
        block_size=BLOCK_SIZE,
        num_slots=rows or len(workload),
    )


def check_positions_llmengine_computes(answer: int | None) -> Verdict:
    """Forward positions llmengine computes to serve the lesson's mixed workload."""
    if answer is None:
        return check_value(None, None, what="the forward positions")
    workload = mixed_workload()
    timing = run_workload(_engine(workload), workload).timing()
    return check_value(
        answer,
        timing.total_forward_tokens,
        what="the positions llmengine computes for the mixed workload",
        explain=(
            "The prompt tokens plus the useful tokens, less one a request: a request's last "
            "token is sampled but never fed back."
        ),
    )


def decode_operators(rows: int) -> int:
    """Operators one decode step of `rows` rows launches, set up as the lesson's
    `decode_anatomy` sets it up: a prefill, one untimed decode step, then the counted one."""
    model = embedded_model()
    workload = llmengine.uniform_burst(rows, 16, 8, vocab_size=model.config.vocab_size, seed=15)
    engine = _engine(workload)
    for spec in workload:
        engine.add_request(list(spec.prompt_token_ids), spec.params)
    engine.step()  # the prefill
    engine.step()  # one decode step
    return throughput.operator_calls(engine.step)


def check_operators_with_fewer_rows(answer: int | None, rows: int = 4) -> Verdict:
    """Operators one decode step launches with `rows` rows instead of the lesson's 16 (within
    10%)."""
    if answer is None:
        return check_value(None, None, what="the operators per step")
    return check_value(
        answer,
        decode_operators(rows),
        what=f"the operators a {rows}-row decode step launches",
        tolerance=0.10,
        explain=(
            "A step launches about as many operators whatever its rows: each operator works on "
            "all of them at once, so fewer rows make each operator cheaper, not fewer."
        ),
    )


def check_generate_waste(answer: float | None) -> Verdict:
    """Tokens `generate` computes over useful tokens for the staircase workload (within 2%)."""
    if answer is None:
        return check_value(None, None, what="computed / useful")
    workload = staircase_workload()
    outputs = _engine(workload).generate(
        throughput.prompts_of(workload), [spec.params for spec in workload]
    )
    useful = throughput.useful_tokens(outputs, workload)
    computed = len(outputs) * max(len(tokens) for tokens in outputs)
    return check_value(
        answer,
        round(computed / useful, 2),
        what="computed / useful for generate on the staircase",
        tolerance=0.02,
        explain=(
            f"generate decodes all {len(outputs)} rows for the longest budget, "
            f"{computed} tokens, of which {useful} are useful."
        ),
    )

"""Lesson 11's exercises: how many forwards a uniform burst takes with more slots, and when the
burst's second wave gets its first token.

Each checker runs lesson 11's uniform burst (8-token prompts, greedy, `ignore_eos=True`)
through the engine on the embedded model and reads the iteration clock.
"""

from __future__ import annotations

from llmengine.bench.timing import ContinuousTiming
from llmengine.lessons.exercises import Verdict, check_value, embedded_model

PROMPT_TOKENS, BLOCK_SIZE, POOL_BLOCKS = 8, 4, 160


def burst_timing(requests: int, budget: int, num_slots: int) -> ContinuousTiming:
    """The engine's run of a uniform burst, timed on the iteration clock."""
    import llmengine

    model = embedded_model()
    burst = llmengine.uniform_burst(
        requests, PROMPT_TOKENS, budget, vocab_size=model.config.vocab_size, seed=31
    )
    blocks = max(POOL_BLOCKS, num_slots * -(-(PROMPT_TOKENS + budget) // BLOCK_SIZE))
    engine = llmengine.Engine(model, num_blocks=blocks, block_size=BLOCK_SIZE, num_slots=num_slots)
    return llmengine.run_workload(engine, burst).timing()


def check_burst_iterations(answer: int | None, num_slots: int = 12, budget: int = 16) -> Verdict:
    """Forwards the engine takes for the sixteen-request burst with `num_slots` slots."""
    if answer is None:
        return check_value(None, None, what=f"the burst's iterations with {num_slots} slots")
    return check_value(
        answer,
        burst_timing(16, budget, num_slots).iterations,
        what=f"the burst's iterations with {num_slots} slots",
        explain="Requests that do not fit in the first wave start only when the first wave's "
        "slots free, and every request needs one forward per token.",
    )


def check_second_wave_ttft(answer: float | None, budget: int = 10) -> Verdict:
    """The time to first token, in iterations, of the last request of the burst to start."""
    if answer is None:
        return check_value(None, None, what="the second wave's time to first token")
    timing = burst_timing(16, budget, 8)
    return check_value(
        answer,
        max(timing.time_to_first_token_s.values()),
        what="the second wave's time to first token",
        explain="The second wave is admitted at the step after the first wave's last token, and "
        "its prefill forward computes its first token.",
    )

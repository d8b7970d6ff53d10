"""Running an engine as the engine tests do: random prompts, integrity checked every step."""

from __future__ import annotations

import random
from collections.abc import Sequence

from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.sampling import SamplingParams


def prompts_for(seed: int, count: int, vocab: int, low: int = 3, high: int = 13) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


def run_recorded(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
) -> tuple[list[list[int]], list[IterationOutcome]]:
    """generate(), stepping by hand: integrity after every step; the outputs and the outcomes."""
    per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else params
    ids = [engine.add_request(p, q) for p, q in zip(prompts, per_prompt, strict=True)]
    outcomes = []
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        assert outcome.rows and outcome.tokens, "a step that ran no forward"
        outcomes.append(outcome)
    # The step that finished the last request has already given everything back.
    assert outcome.finished
    assert engine.num_free_blocks == engine.num_blocks
    assert engine.num_free_swap_blocks == engine.num_swap_blocks
    return [engine.request(i).output_token_ids for i in ids], outcomes


def run_checked(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], int]:
    """`run_recorded`, reporting how many evictions the run took instead of the outcomes."""
    outputs, outcomes = run_recorded(engine, prompts, params)
    return outputs, sum(len(outcome.evicted) for outcome in outcomes)

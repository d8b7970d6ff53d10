"""The overlap (`EngineConfig.overlap`): the same tokens and outcomes with it on as off, under
preemption, swap, prefix caching, chunked prefill, aborts, seeds, speculation, constraints and
stop tokens; and it does overlap: the next step's inputs are built while the forward runs,
and used exactly when the next step's rows are the ones guessed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import llmengine
from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.params import SamplingParams
from llmengine.structured.constraint import Constraint
from tests.engine_runs import prompts_for

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
SEEDED = [
    SamplingParams(max_tokens=16, temperature=0.9, top_k=20, seed=seed, ignore_eos=True)
    for seed in range(5)
]

# Each scenario: the engine's options, and what is asked of it (the prompts' seed, params).
SCENARIOS: dict[str, tuple[dict[str, Any], list[SamplingParams] | SamplingParams]] = {
    "preemption by recompute": ({"num_blocks": 10}, GREEDY),
    "preemption by swap": ({"num_blocks": 10, "preemption": "swap", "swap_blocks": 16}, GREEDY),
    "prefix caching": ({"num_blocks": 32, "enable_prefix_caching": True}, GREEDY),
    "chunked prefill": ({"num_blocks": 32, "max_num_batched_tokens": 6}, GREEDY),
    "seeds, cramped": ({"num_blocks": 10}, SEEDED),
    "ngram speculation": ({"num_blocks": 32, "speculative": "ngram"}, GREEDY),
}


def run_by_hand(
    engine: Engine,
    prompts: list[list[int]],
    params: list[SamplingParams] | SamplingParams,
    between: Callable[[Engine, int], None] = lambda engine, step: None,
) -> tuple[list[list[int]], list[IterationOutcome]]:
    """Every prompt to completion, `between(engine, step)` after each step (aborts, late
    arrivals); the outputs of every request the engine was given, and the outcomes."""
    engine.add_requests(prompts, params)
    outcomes = []
    while engine.has_unfinished():
        outcomes.append(engine.step())
        engine.check_integrity()
        between(engine, len(outcomes))
    outputs = [engine.request(i).output_token_ids for i in range(engine._next_id)]
    engine.close()
    return outputs, outcomes


def both_ways(model: llmengine.Llama, run: Callable[[Engine], Any], **options: Any) -> list[Any]:
    """`run` on an engine without the overlap, then on one with it."""
    return [
        run(Engine(model, block_size=4, num_slots=5, overlap=overlap, **options))
        for overlap in (False, True)
    ]


@pytest.mark.parametrize("name", SCENARIOS)
def test_overlap_keeps_every_token_and_outcome(model: llmengine.Llama, name: str) -> None:
    options, params = SCENARIOS[name]
    prompts = prompts_for(7, 5, model.config.vocab_size)
    if name in ("prefix caching", "ngram speculation"):  # shared prefixes, repeated n-grams
        prompts = [prompts[0] * 2 + prompt for prompt in prompts]
    off, on = both_ways(model, lambda engine: run_by_hand(engine, prompts, params), **options)
    assert on == off
    assert sum(len(outcome.evicted) for outcome in off[1]) or "preemption" not in name


def test_overlap_keeps_tokens_across_aborts_and_late_arrivals(model: llmengine.Llama) -> None:
    """A running request aborted and another added between steps: the guess built for the
    rows before discards itself, and the tokens stay those of the plain step."""
    prompts = prompts_for(8, 3, model.config.vocab_size)

    def between(engine: Engine, step: int) -> None:
        if step == 3:
            engine.abort(1)
        if step == 5:
            engine.add_request([9, 8, 7, 6, 5], GREEDY)

    off, on = both_ways(model, lambda e: run_by_hand(e, prompts, GREEDY, between), num_blocks=32)
    assert on == off
    assert len(off[0]) == 4 and len(off[0][1]) < GREEDY.max_tokens


def test_overlap_keeps_constraints_stop_and_end_tokens(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    romeo = tokenizer.encode("ROMEO:")
    prompts = [romeo, romeo, [5, 6, 7]]
    free = SamplingParams(max_tokens=24)  # its end token may come first
    plain = run_by_hand(Engine(model, num_blocks=32, num_slots=4), [romeo], free)[0]
    params = [
        SamplingParams(max_tokens=12, constraint=Constraint.regex("[a-z ]+")),
        SamplingParams(max_tokens=24, stop_token_ids=(plain[0][3],)),
        free,
    ]

    def run(engine: Engine) -> Any:
        return run_by_hand(engine, prompts, params)

    off, on = both_ways(model, run, num_blocks=32, tokenizer=tokenizer)
    assert on == off
    assert len(off[0][1]) < len(plain[0]) and plain[0][3] not in plain[0][:3]  # it stopped


def test_overlap_builds_the_next_inputs_during_the_forward_and_uses_them_when_right(
    model: llmengine.Llama,
) -> None:
    """One stream of 24 tokens after a prompt of 16 (four whole blocks of 4): the guess made
    during each forward is used by the next step exactly when that step's row needs no new
    block (its position not a multiple of 4), and without the overlap there is none."""
    engine = Engine(model, num_blocks=16, block_size=4, num_slots=1, overlap=True)
    assert engine.runner.overlap is not None
    engine.generate([list(range(1, 17))], SamplingParams(max_tokens=24, ignore_eos=True))
    decode_positions = range(16, 16 + 23)  # the 23 decode steps after the prefill
    assert engine.runner.overlap.reused_steps == sum(p % 4 != 0 for p in decode_positions)
    assert engine.runner.overlap.overlapped_steps > 0
    engine.close()
    assert Engine(model, num_blocks=16, block_size=4, num_slots=1).runner.overlap is None

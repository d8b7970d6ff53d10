"""The static batch runner: the engine's tokens, a rectangle's bill, batches one after another.

The bill is checked on paper first (scripted outcomes through `ContinuousTiming`), then on
the runner's own records, with every expected number worked out from the workload's shape.
"""

from __future__ import annotations

import pytest

import llmengine
from llmengine.bench.batchbench import run_workload
from llmengine.bench.clocks import ScriptedClock
from llmengine.bench.static_batch import run_static_batches
from llmengine.bench.timing import ContinuousTiming
from llmengine.bench.workloads import (
    RequestSpec,
    mixed_workload,
    uniform_burst,
    with_arrivals,
    with_budgets,
)
from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome, PoolShape
from llmengine.sampling import SamplingParams


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The shipped model: the seeds' tables are measured on it."""
    return llmengine.load_model()


def engine_outputs(model: llmengine.Llama, workload: list[RequestSpec]) -> list[list[int]]:
    engine = Engine(model, num_blocks=128, block_size=4, num_slots=8)
    return engine.generate(
        [list(spec.prompt_token_ids) for spec in workload], [spec.params for spec in workload]
    )


def burst(
    model: llmengine.Llama, prompt_len: int, budgets: list[int], seed: int = 0
) -> list[RequestSpec]:
    vocab = model.config.vocab_size
    return with_budgets(
        uniform_burst(len(budgets), prompt_len, 1, vocab_size=vocab, seed=seed), budgets
    )


# -- the padding bill on paper -------------------------------------------------------------


def test_padding_fraction_counts_positions_kept_only_for_the_shape() -> None:
    outcomes = [
        IterationOutcome(0, tokens={0: 1, 1: 2}, rows=2, forward_tokens=5, padded_tokens=1),
        IterationOutcome(1, tokens={0: 3}, rows=2, forward_tokens=1, padded_tokens=1),
        IterationOutcome(
            2, tokens={0: 4}, finished=[0, 1], rows=2, forward_tokens=1, padded_tokens=1
        ),
    ]
    for outcome in outcomes:
        outcome.pool = PoolShape(num_slots=2)
    timing = ContinuousTiming.from_outcomes(outcomes)
    assert timing.padded_tokens == [1, 1, 1]
    assert timing.padding_fraction == pytest.approx(3 / (7 + 3))
    assert timing.waste_fraction == pytest.approx(2 / 6)


def test_the_engine_never_pads(model: llmengine.Llama) -> None:
    run = run_workload(
        Engine(model, num_blocks=32, block_size=4, num_slots=4), burst(model, 3, [2, 5])
    )
    assert run.timing().padded_tokens == [0] * 5
    assert run.timing().padding_fraction == 0.0


# -- the same tokens as the engine ---------------------------------------------------------


def test_day29_shape_generates_the_engines_tokens(model: llmengine.Llama) -> None:
    workload = burst(model, 5, [32] + [4] * 7, seed=29)
    run = run_static_batches(model, workload, num_slots=8)
    assert run.outputs == engine_outputs(model, workload)
    assert [len(tokens) for tokens in run.outputs] == [32] + [4] * 7


def test_mixed_prompt_lengths_generate_the_engines_tokens(model: llmengine.Llama) -> None:
    workload = mixed_workload(
        6, prompt_lens=(2, 11), budgets=(1, 9), vocab_size=model.config.vocab_size, seed=3
    )
    run = run_static_batches(model, workload, num_slots=6)
    assert run.outputs == engine_outputs(model, workload)


def test_a_stop_token_ends_a_row_early_and_the_row_keeps_running(model: llmengine.Llama) -> None:
    workload = burst(model, 4, [6, 6], seed=7)
    free = engine_outputs(model, workload)
    stop = free[1][1]
    assert stop not in free[1][:1], "the stop token must not appear before the early stop"
    params = SamplingParams(max_tokens=6, ignore_eos=True, stop_token_ids=(stop,))
    stopping = [workload[0], RequestSpec(workload[1].prompt_token_ids, params)]
    run = run_static_batches(model, stopping, num_slots=2)
    assert run.outputs == engine_outputs(model, stopping)
    timing = run.timing()
    assert timing.iterations == 6 and timing.rows == [2] * 6
    assert timing.tokens_collected == [2, 2] + [1] * 4


# -- the rectangle's records ---------------------------------------------------------------


def test_day29_records(model: llmengine.Llama) -> None:
    timing = run_static_batches(model, burst(model, 5, [32] + [4] * 7), num_slots=8).timing()
    assert timing.iterations == 32 and timing.rows == [8] * 32
    assert timing.tokens_collected == [8] * 4 + [1] * 28
    assert timing.prefill_rows == [8] + [0] * 31
    assert timing.forward_tokens == [40] + [8] * 3 + [1] * 28
    assert timing.padded_tokens == [0] * 4 + [7] * 28
    assert timing.waste_fraction == pytest.approx(196 / 256)
    assert timing.padding_fraction == pytest.approx(196 / (92 + 196))
    assert timing.latencies_iterations == dict.fromkeys(range(8), 32)


def test_prefill_padding_is_the_rectangle_minus_the_prompts(model: llmengine.Llama) -> None:
    vocab = model.config.vocab_size
    prompts = [(1, 2), (3, 4, 5, 6, 7), (8, 9, 10)]
    workload = [RequestSpec(p, SamplingParams(max_tokens=2, ignore_eos=True)) for p in prompts]
    assert max(max(p) for p in prompts) < vocab
    timing = run_static_batches(model, workload, num_slots=4).timing()
    assert timing.forward_tokens == [10, 3] and timing.padded_tokens == [5, 0]
    assert timing.occupancy == pytest.approx(6 / (2 * 4))


def test_batches_run_one_after_another(model: llmengine.Llama) -> None:
    # Two slots: requests 0 and 1 form the first rectangle (3 forwards), request 2 the
    # second (2 forwards); request 3 arrives at 10, after everything is done, and waits.
    workload = with_arrivals(burst(model, 3, [3, 1, 2, 2]), [0, 0, 0, 10])
    run = run_static_batches(model, workload, num_slots=2)
    timing = run.timing()
    assert timing.rows == [2, 2, 2, 1, 1, 1, 1]
    assert timing.latencies_iterations == {0: 3, 1: 3, 2: 5, 3: 2}
    assert timing.latencies_s == {0: 3.0, 1: 3.0, 2: 5.0, 3: 2.0}
    assert run.outputs == engine_outputs(model, workload)


def test_a_request_arriving_mid_batch_waits_for_the_batch(model: llmengine.Llama) -> None:
    workload = with_arrivals(burst(model, 3, [4, 2]), [0, 1])
    run = run_static_batches(model, workload, num_slots=2, clock=ScriptedClock([0.5] * 6))
    timing = run.timing()
    assert timing.rows == [1] * 6
    assert timing.latencies_iterations == {0: 4, 1: 6 - 2}
    assert timing.latencies_s == {0: 2.0, 1: pytest.approx(3.0 - 1.0)}
    assert timing.time_to_first_token_s[1] == pytest.approx(2.5 - 1.0)


def test_slots_must_be_positive(model: llmengine.Llama) -> None:
    with pytest.raises(ValueError, match="num_slots"):
        run_static_batches(model, burst(model, 2, [1]), num_slots=0)


def test_with_budgets_changes_only_the_budget(model: llmengine.Llama) -> None:
    base = uniform_burst(3, 4, 1, vocab_size=model.config.vocab_size, seed=1)
    changed = with_budgets(base, [5, 1, 2])
    assert [spec.params.max_tokens for spec in changed] == [5, 1, 2]
    assert [spec.prompt_token_ids for spec in changed] == [spec.prompt_token_ids for spec in base]
    assert all(spec.params.greedy and spec.params.ignore_eos for spec in changed)
    with pytest.raises(ValueError, match="3 requests but 2 budgets"):
        with_budgets(base, [1, 2])

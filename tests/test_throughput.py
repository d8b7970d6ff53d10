"""The throughput benchmark's measurement functions, on a tiny random model; no timing asserted.

What is checked is what the numbers are made of: which tokens count as useful, that the
engines, eager and compiled, really generate the same tokens from the same weights, the
agreement and ratio arithmetic, the interleaving of repeats and what happens to an engine that
fails, and that the step profile's phases and the decode step's costs add up.
"""

from __future__ import annotations

import pytest
import torch
from hf_llama import TINY_LLAMA

import llmengine
from llmengine.bench import compiled_runners, decode_step, throughput
from llmengine.bench.throughput import Agreement, EngineRun


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tiny")
    throughput.save_random_checkpoint(folder, seed=3, **TINY_LLAMA)
    return throughput.load_both(folder)


@pytest.fixture(scope="module")
def mixed() -> list[llmengine.RequestSpec]:
    return llmengine.mixed_workload(6, prompt_lens=(2, 9), budgets=(2, 12), vocab_size=101, seed=5)


def run(engine: str, seconds: float, outputs: list[list[int]]) -> EngineRun:
    return EngineRun(engine, seconds, outputs, sum(len(out) for out in outputs))


def test_checkpoint_is_the_same_model_in_both_libraries(models) -> None:
    model, hf_model = models
    assert throughput.parameter_count(model) == throughput.parameter_count(hf_model)
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.inference_mode():
        ours, theirs = model(ids), hf_model(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_bench_shape_is_the_configuration_the_issue_names() -> None:
    shape = decode_step.BENCH_SHAPE
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]) == (512, 8, 8192)
    assert (shape["num_attention_heads"], shape["num_key_value_heads"]) == (8, 4)


def test_useful_tokens_count_each_output_up_to_its_own_budget(mixed) -> None:
    budgets = throughput.budgets_of(mixed)
    exact = [[1] * budget for budget in budgets]
    longer = [[1] * (budget + 3) for budget in budgets]
    assert throughput.useful_tokens(exact, mixed) == sum(budgets)
    assert throughput.useful_tokens(longer, mixed) == sum(budgets)
    short = [[1] * (budget - 1) for budget in budgets]
    assert throughput.useful_tokens(short, mixed) == sum(budgets) - len(mixed)
    with pytest.raises(ValueError, match="outputs"):
        throughput.useful_tokens(exact[1:], mixed)


def test_pool_holds_every_worst_case(mixed) -> None:
    expected = sum(
        llmengine.blocks_for_length(len(spec.prompt_token_ids) + spec.params.max_tokens, 4)
        for spec in mixed
    )
    assert throughput.pool_blocks(mixed, 4) == expected


def test_left_padding_puts_every_prompt_at_the_right_edge() -> None:
    ids, mask = throughput.left_padded([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_three_engines_generate_the_same_tokens_and_count_only_budgets(models, mixed) -> None:
    model, hf_model = models
    runs = {
        "llmengine": throughput.run_llmengine(model, mixed, block_size=4),
        "generate": throughput.run_generate(hf_model, mixed),
        "generate_batch": throughput.run_generate_batch(hf_model, mixed, block_size=4),
    }
    budgets = throughput.budgets_of(mixed)
    for name, engine_run in runs.items():
        assert engine_run.engine == name
        assert [len(out) for out in engine_run.outputs] == budgets
        assert engine_run.useful_tokens == sum(budgets)
        assert engine_run.seconds > 0
    reference = runs["llmengine"].outputs
    assert reference == llmengine.Engine(model, num_blocks=64, block_size=4).generate(
        throughput.prompts_of(mixed), [spec.params for spec in mixed]
    )
    for name in ("generate", "generate_batch"):
        assert throughput.agreement(reference, runs[name].outputs) == Agreement(
            len(mixed), len(mixed), sum(budgets), sum(budgets)
        )


def test_an_engine_built_beforehand_serves_workload_after_workload(models, mixed) -> None:
    model, _ = models
    engine = llmengine.Engine(model, num_blocks=64, block_size=4, num_slots=len(mixed))
    for workload in (mixed, mixed[:2]):
        run = throughput.run_on_engine(engine, workload)
        assert run.outputs == throughput.run_llmengine(model, workload, block_size=4).outputs
        assert run.useful_tokens == sum(throughput.budgets_of(workload)) and run.seconds > 0
    engine.check_integrity()


def test_generate_passes_its_options_on_under_the_name_given(models, mixed) -> None:
    _, hf_model = models
    plain = throughput.run_generate(hf_model, mixed)
    static = throughput.run_generate(
        hf_model, mixed, engine="static", cache_implementation="static", disable_compile=True
    )
    assert static.engine == "static"
    assert static.outputs == plain.outputs
    with pytest.raises(ValueError, match="cache_implementation"):
        throughput.run_generate(hf_model, mixed, cache_implementation="no such cache")


def test_compiled_generate_yields_llmengine_s_greedy_tokens(models, mixed) -> None:
    model, hf_model = models
    two = mixed[:2]
    compiled = compiled_runners.run_generate_compiled(hf_model, two)
    assert compiled.engine == "generate_compiled"
    assert compiled.outputs == throughput.run_llmengine(model, two, block_size=4).outputs
    # The forward really went through torch.compile, not the eager one.
    assert hasattr(hf_model, "_compiled_call")


def test_compiled_llmengine_generates_the_same_tokens(models, mixed) -> None:
    model, _ = models
    two = mixed[:2]
    compiled = throughput.run_llmengine(model, two, block_size=4, compile=True)
    assert compiled.engine == "llmengine compiled"
    assert compiled.outputs == throughput.run_llmengine(model, two, block_size=4).outputs


def test_all_runners_are_the_five_engines_in_order(models) -> None:
    runners = compiled_runners.all_runners(*models)
    assert tuple(runners) == compiled_runners.ALL_ENGINES
    assert set(compiled_runners.COMPILED_ENGINES) <= set(runners)
    assert set(throughput.ENGINES) <= set(runners)


def test_agreement_counts_requests_and_tokens_before_the_first_difference() -> None:
    reference = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    other = [[1, 2, 3], [4, 0, 6, 7], [1, 9]]
    assert throughput.agreement(reference, other) == Agreement(1, 3, 3 + 1 + 0, 9)
    assert throughput.agreement(reference, other, among=[1]) == Agreement(0, 1, 1, 4)
    assert throughput.agreement(reference, [[1, 2], [4, 5, 6, 7], [8, 9]]) == Agreement(
        2, 3, 2 + 4 + 2, 9
    )
    with pytest.raises(ValueError, match="reference outputs"):
        throughput.agreement(reference, other[:2])


def test_unpadded_requests_are_those_with_the_longest_prompt() -> None:
    params = llmengine.SamplingParams(max_tokens=2)
    workload = [
        llmengine.RequestSpec(tuple(range(1, length + 1)), params) for length in (3, 5, 2, 5)
    ]
    assert throughput.unpadded_requests(workload) == [1, 3]


def test_speedup_is_the_ratio_of_useful_tokens_per_second() -> None:
    fast = run("llmengine", 2.0, [[1] * 30, [1] * 10])  # 20 tokens/s
    slow = run("generate", 5.0, [[1] * 40, [1] * 10])  # 10 tokens/s
    assert fast.tokens_per_s == 20.0
    assert slow.tokens_per_s == 10.0
    assert throughput.speedup(fast, slow) == 2.0
    assert throughput.speedup(slow, fast) == 0.5


def test_median_run_takes_the_middle_duration_and_refuses_different_tokens() -> None:
    runs = [run("x", seconds, [[1, 2]]) for seconds in (3.0, 1.0, 2.0)]
    assert throughput.median_run(runs).seconds == 2.0
    assert throughput.median_run(runs[:2]).seconds == 1.0  # even count: the faster middle
    with pytest.raises(RuntimeError, match="different tokens"):
        throughput.median_run([*runs, run("x", 4.0, [[1, 3]])])


def test_compare_engines_warms_up_then_interleaves_the_rounds(mixed) -> None:
    calls: list[tuple[str, int]] = []
    clock = iter(float(n) for n in range(1, 100))

    def runner(name: str):
        def serve(workload):
            calls.append((name, len(workload)))
            return run(name, next(clock), [[1] * spec.params.max_tokens for spec in workload])

        return serve

    results = throughput.compare_engines(
        {"a": runner("a"), "b": runner("b")}, mixed, repeats=3, warmup=2
    )
    assert calls == [("a", 2), ("b", 2)] + [("a", 6), ("b", 6)] * 3
    assert results["a"].seconds == 5.0  # a's rounds took 3, 5, 7 clock readings
    assert results["b"].seconds == 6.0
    with pytest.raises(ValueError, match="repeats"):
        throughput.compare_engines({"a": runner("a")}, mixed, repeats=0)


def test_compare_warms_up_on_the_whole_workload_and_drops_a_failing_engine(mixed) -> None:
    calls: list[tuple[str, int]] = []

    def serve(workload):
        calls.append(("ok", len(workload)))
        return run("ok", 1.0, [[1] * spec.params.max_tokens for spec in workload])

    def unavailable(workload):
        raise ValueError("no such engine")

    def breaks_on_the_second_call(workload):
        calls.append(("late", len(workload)))
        if len(calls) > 2:
            raise RuntimeError("compiler crashed\nwith a long trace")
        return run("late", 1.0, [[1] * spec.params.max_tokens for spec in workload])

    comparison = throughput.compare(
        {"ok": serve, "missing": unavailable, "late": breaks_on_the_second_call},
        mixed,
        repeats=2,
        warmup=None,
    )
    assert calls == [("ok", 6), ("late", 6), ("ok", 6), ("late", 6), ("ok", 6)]
    assert list(comparison.runs) == ["ok"]
    assert comparison.failures == {
        "missing": "did not run: ValueError: no such engine",
        "late": "did not run: RuntimeError: compiler crashed",
    }
    assert list(comparison.warmup_seconds) == ["ok"]
    assert comparison.first_call_extra_s("ok") == pytest.approx(
        comparison.warmup_seconds["ok"] - 1.0
    )
    with pytest.raises(RuntimeError, match="engines failed"):
        throughput.compare_engines({"ok": serve, "missing": unavailable}, mixed, repeats=1)


def test_step_profile_phases_add_up_and_leave_the_engine_as_it_was(models, mixed) -> None:
    model, _ = models
    engine = llmengine.Engine(model, num_blocks=64, block_size=4, num_slots=len(mixed))
    profile = throughput.profile_steps(engine, mixed)
    # Everyone is admitted in the first forward: one forward per token of the longest budget.
    assert profile.steps == max(throughput.budgets_of(mixed))
    assert list(profile.seconds) == list(throughput.PHASES)
    assert all(seconds >= 0 for seconds in profile.seconds.values())
    assert profile.seconds[throughput.FORWARD_PHASE] > 0
    assert sum(profile.share(phase) for phase in throughput.PHASES) == pytest.approx(1.0)
    assert profile.outside_forward_share == pytest.approx(
        1.0 - profile.share(throughput.FORWARD_PHASE)
    )
    assert "schedule" not in vars(engine.scheduler)
    assert "forward_hidden" not in vars(model) and "compute_logits" not in vars(model)
    assert not engine.has_unfinished()


def test_machine_description_names_what_the_numbers_depend_on() -> None:
    described = dict(throughput.machine_description())
    assert described["torch"] == torch.__version__
    assert {"processor", "logical CPUs", "torch threads", "transformers"} <= described.keys()


def test_operator_calls_count_only_the_calls_made_from_python() -> None:
    assert throughput.operator_calls(lambda: torch.ones(3) + 1) == 2  # ones, add


def test_decode_weights_are_every_matrix_once(models) -> None:
    model, _ = models  # untied: the embedding table is only looked up
    hidden, inner, vocab = (
        TINY_LLAMA["hidden_size"],
        TINY_LLAMA["intermediate_size"],
        TINY_LLAMA["vocab_size"],
    )
    head_dim = hidden // TINY_LLAMA["num_attention_heads"]
    kv = TINY_LLAMA["num_key_value_heads"] * head_dim
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner
    weights = throughput.decode_weights(model)
    assert (
        sum(w.numel() for w in weights)
        == TINY_LLAMA["num_hidden_layers"] * per_layer + vocab * hidden
    )
    assert len(weights) == 7 * TINY_LLAMA["num_hidden_layers"] + 1  # q k v o gate up down, lm_head


def test_decode_weights_of_a_tied_model_include_the_embedding_once() -> None:
    model = llmengine.load_model()  # the embedded model ties its output to its embedding
    assert model.lm_head is None
    weights = throughput.decode_weights(model)
    assert sum(w is model.embed_tokens.weight for w in weights) == 1


def test_matrix_product_time_is_positive(models) -> None:
    model, _ = models
    assert throughput.matrix_product_seconds(model, rows=4, repeats=3) > 0


def test_decode_step_cost_sets_the_paged_step_against_its_parts(models) -> None:
    model, _ = models
    cost = throughput.decode_step_cost(model, rows=4, context=6)
    assert (cost.rows, cost.context) == (4, 6)
    assert min(cost.matrix_products_s, cost.paged_step_s, cost.contiguous_step_s) > 0
    assert cost.matrix_share == cost.matrix_products_s / cost.paged_step_s
    assert cost.paged_over_contiguous == cost.paged_step_s / cost.contiguous_step_s
    paged_step = decode_step.prepare_decode_steps(model, 4, 6).paged
    with torch.inference_mode():
        assert cost.operators == throughput.operator_calls(paged_step)
    # At least one matrix product per weight matrix: the count is of the whole step.
    assert cost.operators > len(throughput.decode_weights(model))

"""Kernels chosen by measurement: every candidate computes F.linear, eager is never beaten by
noise, each row count goes through its bucket's kernel, and the model's text does not change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hf_llama import save_random_llama

import llmengine
from llmengine.bench.throughput import operator_counts
from llmengine.runner.loading import load_model
from llmengine.speed.kernels import (
    KERNELS,
    MARGIN,
    ROW_BUCKETS,
    ChosenKernels,
    candidates_for,
    fastest_kernel,
    measure_kernels,
)
from llmengine.speed.prepare import prepare_for_speed, products

PREPARED_OPERATORS = {
    "mkl-packed": "mkl._mkl_linear.default",
    "onednn": "mkldnn._linear_pointwise.default",
}


def random_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.1


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("rows", [1, 3, 8, 33, 130])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
def test_every_float32_kernel_computes_the_linear_product(name, rows, with_bias):
    weight = random_weight(72, 40, seed=rows)
    if name not in candidates_for(weight):
        pytest.skip(f"{name} is not available on this machine")
    bias = torch.randn(72) if with_bias else None
    x = torch.randn(rows, 40)
    kernel = KERNELS[name]
    out = kernel.run(kernel.prepare(weight), x, weight, bias)
    assert out.shape == (rows, 72)
    assert (out - F.linear(x, weight, bias)).abs().max().item() < 1e-4


def test_bfloat16_candidates_compute_the_bfloat16_product():
    weight = random_weight(64, 48).bfloat16()
    x = torch.randn(5, 48).bfloat16()
    expected = F.linear(x.float(), weight.float())
    assert "mkl-packed" not in candidates_for(weight)  # MKL packs float32 only
    for name in candidates_for(weight):
        kernel = KERNELS[name]
        out = kernel.run(kernel.prepare(weight), x, weight, None)
        assert out.dtype == torch.bfloat16
        assert (out.float() - expected).abs().max().item() < 0.05


def test_eager_is_kept_unless_beaten_by_the_margin():
    assert fastest_kernel({"eager": 1.0, "onednn": 1.0 - MARGIN / 2}) == "eager"
    assert fastest_kernel({"eager": 1.0, "onednn": 0.5, "mkl-packed": 0.7}) == "onednn"
    assert fastest_kernel({"eager": 1.0, "onednn": 1.5}) == "eager"


def test_measurement_times_every_candidate_at_every_bucket_and_keeps_its_rule():
    weight = random_weight(96, 64)
    measured = measure_kernels(weight, buckets=(1, 4, 16))
    assert [bucket.rows for bucket in measured.buckets] == [1, 4, 16]
    for bucket in measured.buckets:
        assert set(bucket.seconds) == set(candidates_for(weight))
        assert all(seconds > 0 for seconds in bucket.seconds.values())
        assert bucket.chosen == fastest_kernel(bucket.seconds)
        assert bucket.speedup >= 1.0
    assert measured.shape == (96, 64) and measured.threads == torch.get_num_threads()


def test_a_shape_is_measured_once_per_process():
    weight = random_weight(40, 24)
    first = measure_kernels(weight, buckets=(2, 8))
    assert measure_kernels(random_weight(40, 24, seed=9), buckets=(2, 8)) is first
    assert measure_kernels(weight, buckets=(2, 8), names=["eager"]) is not first


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match="unknown kernels"):
        candidates_for(random_weight(4, 4), ["eager", "cublas"])


def test_each_row_count_goes_through_its_buckets_kernel():
    weight = random_weight(48, 32)
    available = [name for name in candidates_for(weight) if name != "eager"]
    if not available:
        pytest.skip("only eager F.linear on this machine")
    other = available[0]
    chosen = ChosenKernels(weight, {1: "eager", 8: other, 32: "eager", 64: other})
    assert set(chosen.operands) == {"eager", other}
    expected = {1: "eager", 2: other, 8: other, 9: "eager", 32: "eager", 33: other, 500: other}
    for rows, name in expected.items():
        assert chosen.kernel_for(rows) == name
        x = torch.randn(1, rows, 32)
        counts = operator_counts(lambda x=x: chosen.linear(x))
        for prepared, operator in PREPARED_OPERATORS.items():
            assert counts[operator] == (prepared == name)
        assert (chosen.linear(x) - F.linear(x, weight)).abs().max().item() < 1e-4


@pytest.mark.parametrize("choice", [{}, {4: "eager", 64: "eager"}], ids=["empty", "all eager"])
def test_an_eager_choice_is_one_plain_linear(choice):
    weight = random_weight(24, 16)
    chosen = ChosenKernels(weight, choice)
    assert chosen.is_eager and chosen.kernel_for(500) == "eager"
    x = torch.randn(2, 9, 16)
    assert operator_counts(lambda: chosen.linear(x)) == operator_counts(lambda: F.linear(x, weight))
    assert torch.equal(chosen.linear(x), F.linear(x, weight))


@pytest.fixture(scope="module")
def measured_and_eager(tmp_path_factory):
    folder = tmp_path_factory.mktemp("random")
    save_random_llama(folder, attention_bias=True)
    return load_model(folder), load_model(folder, kernels="eager")


def test_load_model_measures_every_distinct_product(measured_and_eager):
    measured, eager = measured_and_eager
    measurements = measured.kernel_measurements()
    assert set(measurements) == {"qkv", "o", "gate_up", "down", "head"}
    assert [b.rows for b in measurements["qkv"].buckets] == list(ROW_BUCKETS)
    assert measurements["head"].shape == tuple(measured.output_head.weight.shape)
    # Layers of the same shape share one measurement; eager loads measure nothing.
    downs = [layer.mlp.down_proj.product for layer in measured.layers]
    assert all(down.measurement is downs[0].measurement for down in downs)
    assert eager.kernel_measurements() == {}
    assert all(product.kernel.is_eager for product in products(eager))


def test_measured_kernels_give_the_eager_logits(measured_and_eager):
    measured, eager = measured_and_eager
    for rows in (1, 5, 40):
        ids = torch.randint(0, measured.config.vocab_size, (1, rows))
        with torch.inference_mode():
            assert (measured(ids) - eager(ids)).abs().max().item() < 1e-4


def test_a_converted_model_is_measured_again_for_its_dtype(measured_and_eager):
    measured, _ = measured_and_eager
    model = llmengine.Llama(measured.config)
    model.load_state_dict(measured.state_dict())
    prepared = prepare_for_speed(model.eval().requires_grad_(False))
    prepared.to(torch.bfloat16)
    assert prepared.kernels == "measured"
    # Measured for bfloat16 where this CPU has a bfloat16 kernel beside F.linear (oneDNN's
    # needs AVX512_BF16 or AMX); with none, there is nothing to choose and nothing measured.
    has_choice = len(candidates_for(prepared.output_head.weight)) > 1
    expected = {torch.bfloat16} if has_choice else set()
    assert {m.dtype for m in prepared.kernel_measurements().values()} == expected


def test_embedded_greedy_text_is_the_same_with_every_kernel_preparation():
    tokenizer = llmengine.load_tokenizer()
    params = llmengine.SamplingParams(max_tokens=24)
    texts = set()
    for kernels in ("measured", "packed", "eager"):
        engine = llmengine.Engine(
            load_model(kernels=kernels), num_blocks=32, num_slots=4, tokenizer=tokenizer
        )
        texts.add(tuple(engine.generate_text(["ROMEO:", "First Citizen:", "KING"], params)))
    assert len(texts) == 1


def test_load_model_refuses_unknown_kernels():
    with pytest.raises(ValueError, match="kernels must be one of"):
        load_model(kernels="fastest")


def test_a_weight_with_only_eager_to_choose_from_is_not_timed(measured_and_eager):
    measured, _ = measured_and_eager
    model = llmengine.Llama(measured.config)
    model.load_state_dict(measured.state_dict())
    prepared = prepare_for_speed(model.to(torch.float16))
    assert candidates_for(prepared.output_head.weight) == ["eager"]
    assert prepared.kernel_measurements() == {}
    assert all(product.kernel.is_eager for product in products(prepared))

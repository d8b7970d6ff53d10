"""Weight-only int8: what the int8 values stand for, the product by them, and a model that
multiplies by them everywhere while its text stays close to float32's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import llmengine
from llmengine.bench.precision import held_out_ids
from llmengine.cli import main
from llmengine.runner.loading import load_model
from llmengine.speed.prepare import PreparedLlama, products
from llmengine.speed.quantization import Int8Weight


def random_weight(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_each_value_is_within_half_a_step_of_the_weight():
    weight = random_weight(64, 48)
    weight[3] = 0.0  # a row of zeros must not divide by zero
    int8 = Int8Weight(weight)
    assert int8.values.dtype == torch.int8 and int8.values.shape == (64, 48)
    assert int8.values.abs().max().item() == 127  # every non-zero row uses the full range
    steps = int8.scales.float()[:, None]
    assert ((int8.dequantized() - weight).abs() <= steps / 2 + 1e-8).all()
    assert (int8.values[3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 32])
def test_the_product_is_the_product_by_the_dequantized_weight(dtype, rows):
    weight = random_weight(80, 64, seed=rows).to(dtype)
    bias = torch.randn(80).to(dtype)
    x = torch.randn(2, rows, 64).to(dtype)
    int8 = Int8Weight(weight)
    out = int8.linear(x, bias)
    assert out.dtype == dtype and out.shape == (2, rows, 80)
    expected = F.linear(x.float(), int8.dequantized().float(), bias.float())
    # The product runs on bfloat16 activations: within bfloat16's rounding of the result.
    assert (out.float() - expected).abs().max().item() < 0.02 * expected.abs().max().item()


def test_only_float_matrices_are_quantised():
    with pytest.raises(ValueError, match="2-D float"):
        Int8Weight(torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D float"):
        Int8Weight(torch.zeros(4))


@pytest.fixture(scope="module")
def int8_model() -> PreparedLlama:
    return load_model(quantization="int8")


def test_every_product_of_an_int8_model_is_int8(int8_model):
    assert all(isinstance(product.kernel, Int8Weight) for product in products(int8_model))
    assert int8_model.kernel_measurements() == {}


def test_int8_logits_stay_close_to_float32(int8_model, model):
    ids = torch.tensor([held_out_ids(llmengine.load_tokenizer())[:200]])
    with torch.inference_mode():
        full, quantised = model(ids), int8_model(ids)
    spread = (full.max() - full.min()).item()
    assert 0 < (quantised - full).abs().max().item() < 0.05 * spread
    assert (quantised.argmax(-1) == full.argmax(-1)).float().mean().item() >= 0.9


def test_a_converted_int8_model_quantises_again():
    converted = load_model(quantization="int8").to(torch.bfloat16)
    assert all(product.kernel.dtype == torch.bfloat16 for product in products(converted))
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.inference_mode():
        assert converted(ids).dtype == torch.bfloat16


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization must be one of"):
        load_model(quantization="int4")


def test_generate_takes_quantization_and_kernels(capsys):
    argv = ["generate", "--prompt", "ROMEO:", "--max-tokens", "4", "--kernels", "eager"]
    assert main([*argv, "--quantization", "int8"]) == 0
    assert capsys.readouterr().out
    assert main([*argv, "--quantization", "none"]) == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--prompt", "ROMEO:", "--kernels", "fastest"])
    assert exit_info.value.code == 2


def test_the_decode_graph_refuses_an_int8_model(int8_model):
    with pytest.raises(ValueError, match="int8"):
        llmengine.Engine(int8_model, num_blocks=8, num_slots=2, decode_graph=[1])

"""Fused Q/K/V and gate/up projections: same logits, same names, one matrix product each."""

from __future__ import annotations

import pytest
import torch
from hf_llama import save_random_llama

from llmengine.bench.throughput import operator_counts
from llmengine.model.llama import MLP, Attention, Llama
from llmengine.runner.loading import load_model
from llmengine.speed.kernels import (
    PACKED_ROWS,
    ChosenKernels,
    PackedWeight,
    can_pack,
    packed_choice,
)
from llmengine.speed.prepare import (
    FusedAttention,
    FusedMLP,
    PreparedLlama,
    prepare_for_speed,
    products,
)


def unfused_copy(model: Llama) -> Llama:
    """The same weights in a fresh model whose projections are computed one by one."""
    copy = Llama(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.eval().requires_grad_(False)


@pytest.fixture(params=[{}, {"attention_bias": True, "mlp_bias": True}], ids=["plain", "biases"])
def fused_model(tmp_path, request) -> Llama:
    save_random_llama(tmp_path, **request.param)
    return load_model(tmp_path, kernels="packed")


def ids_for(model: Llama) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    return torch.randint(0, model.config.vocab_size, (2, 24), generator=generator)


def test_load_model_fuses_every_layer(fused_model):
    for layer in fused_model.layers:
        assert isinstance(layer.self_attn, FusedAttention)
        assert isinstance(layer.mlp, FusedMLP)
    plain = unfused_copy(fused_model)
    assert type(plain) is Llama
    assert type(plain.layers[0].self_attn) is Attention and type(plain.layers[0].mlp) is MLP
    linears = [module for module in plain.modules() if isinstance(module, torch.nn.Linear)]
    assert {type(linear) for linear in linears} == {torch.nn.Linear}


def test_fused_logits_equal_unfused(fused_model):
    ids = ids_for(fused_model)
    with torch.inference_mode():
        difference = (fused_model(ids) - unfused_copy(fused_model)(ids)).abs().max().item()
    assert difference < 1e-5


def test_fused_weights_are_the_parameters(fused_model):
    projections = fused_model.layers[0].self_attn.qkv
    q_proj = fused_model.layers[0].self_attn.q_proj
    assert q_proj.weight.data_ptr() == projections.weight.data_ptr()
    with torch.no_grad():
        q_proj.weight[0, 0] = 123.0
    assert projections.weight[0, 0].item() == 123.0


def test_names_and_count_of_parameters_unchanged(fused_model):
    unfused = unfused_copy(fused_model)
    assert fused_model.state_dict().keys() == unfused.state_dict().keys()
    assert sum(p.numel() for p in fused_model.parameters()) == sum(
        p.numel() for p in unfused.parameters()
    )


def test_conversion_keeps_the_fused_matrix_in_step(fused_model):
    fused_model.to(torch.float64)
    mlp = fused_model.layers[1].mlp
    projections = mlp.gate_up
    assert projections.weight.dtype == torch.float64
    assert mlp.up_proj.weight.data_ptr() != projections.weight.data_ptr()
    assert all(
        layer.weight.untyped_storage().data_ptr() == projections.weight.untyped_storage().data_ptr()
        for layer in (mlp.gate_proj, mlp.up_proj)
    )


def test_loading_weights_into_a_packed_model_repacks(fused_model, tmp_path):
    config = fused_model.config
    biases = {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias}
    save_random_llama(tmp_path / "other", seed=5, **biases)
    other = load_model(tmp_path / "other", kernels="packed")
    ids = ids_for(fused_model)
    for assign in (False, True):
        fused_model.load_state_dict(unfused_copy(other).state_dict(), assign=assign)
        assert all(product.is_packed for product in products(fused_model))
        with torch.inference_mode():
            assert (fused_model(ids) - other(ids)).abs().max().item() < 1e-5


def test_fusing_leaves_three_matrix_products_per_layer(fused_model):
    ids = ids_for(fused_model)
    unfused_model = unfused_copy(fused_model)
    with torch.inference_mode():
        fused = operator_counts(lambda: fused_model(ids))
        unfused = operator_counts(lambda: unfused_model(ids))

    def linear_calls(counts) -> int:
        return counts["aten.linear.default"] + counts["mkl._mkl_linear.default"]

    layers = fused_model.config.num_hidden_layers
    assert linear_calls(unfused) == 7 * layers + 1  # q, k, v, o, gate, up, down; the head
    assert linear_calls(fused) == 4 * layers + 1  # qkv, o, gate-up, down
    assert len(products(unfused_model)) == linear_calls(unfused)
    assert len(products(fused_model)) == linear_calls(fused)


@pytest.mark.parametrize("rows", [1, 3, 4, 17, 48, 49, 200])
def test_packed_product_equals_linear_for_any_row_count(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=generator)
    bias = torch.randn(96, generator=generator)
    x = torch.randn(2, rows, 40, generator=generator)
    packed = PackedWeight(weight)
    expected = torch.nn.functional.linear(x, weight, bias)
    dispatched = ChosenKernels(weight, packed_choice()).linear(x, bias)
    assert (dispatched - expected).abs().max().item() < 1e-4
    assert (packed.packed_linear(x, bias) - expected).abs().max().item() < 1e-4


def test_packed_copy_is_used_only_for_packed_rows():
    weight = torch.randn(8, 4)
    packed = ChosenKernels(weight, packed_choice())
    for rows in (1, 3, 4, 48, 49, 200):
        counts = operator_counts(lambda rows=rows: packed.linear(torch.randn(rows, 4)))
        assert counts["mkl._mkl_linear.default"] == (rows in PACKED_ROWS)


def test_only_float32_cpu_weights_are_packed():
    assert can_pack(torch.zeros(4, 4))
    assert not can_pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="cannot pack"):
        PackedWeight(torch.zeros(4, 4, dtype=torch.bfloat16))


def test_bfloat16_model_is_fused_but_not_packed(fused_model):
    fused_model.to(torch.bfloat16)
    converted = products(fused_model)
    assert len(converted) == 4 * fused_model.config.num_hidden_layers + 1
    assert not any(product.is_packed for product in converted)
    assert all(product.weight.dtype == torch.bfloat16 for product in converted)
    fused_model.to(torch.float32)
    assert all(product.is_packed for product in products(fused_model))


def test_preparing_refuses_an_unknown_preparation_before_changing_the_model(fused_model):
    plain = unfused_copy(fused_model)
    with pytest.raises(ValueError, match="kernels must be one of"):
        prepare_for_speed(plain, "fastest")
    assert type(plain) is Llama and type(plain.layers[0].self_attn) is Attention
    assert isinstance(prepare_for_speed(plain, "eager"), PreparedLlama)

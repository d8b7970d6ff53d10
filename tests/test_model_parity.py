"""`load_model` reproduces transformers' Llama: logits within 1e-4 and identical greedy text."""

from __future__ import annotations

import pytest
import torch
from hf_llama import (
    LLAMA3_ROPE,
    edit_config,
    greedy,
    hf_greedy,
    save_random_llama,
    to_old_rope_layout,
)

from llmengine.model.loader import embedded_model_path
from llmengine.runner.loading import load_model

CASES = {
    "mha-1-layer": {"num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1},
    "gqa2-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "gqa4-head-dim-override": {
        "hidden_size": 48,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "num_hidden_layers": 3,
    },
    "gqa4-llama3-rope-4-layers": {
        "num_key_value_heads": 1,
        "num_hidden_layers": 4,
        "rope_parameters": LLAMA3_ROPE,
        "tie_word_embeddings": True,
    },
    "biases-llama3-rope": {
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": LLAMA3_ROPE,
    },
}


def random_ids(vocab_size: int, shape: tuple[int, int], seed: int = 1) -> torch.Tensor:
    """Seeded token ids; 48 positions reach well past llama3's original 16-token context."""
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def assert_same_logits(hf, model, ids: torch.Tensor) -> None:
    with torch.no_grad():
        expected = hf(ids).logits
        actual = model(ids)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_logits_and_greedy_match_transformers(tmp_path, overrides):
    hf = save_random_llama(tmp_path, **overrides)
    model = load_model(tmp_path)
    ids = random_ids(hf.config.vocab_size, (2, 48))
    assert_same_logits(hf, model, ids)
    prompt = ids[:, :6]
    assert greedy(model, prompt, 16) == hf_greedy(hf, prompt, 16)


def test_sharded_checkpoint(tmp_path):
    hf = save_random_llama(tmp_path, max_shard_size="20KB", rope_parameters=LLAMA3_ROPE)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    assert_same_logits(hf, load_model(tmp_path), random_ids(hf.config.vocab_size, (2, 40)))


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, {"rope_type": "default", "rope_theta": 1000.0}])
def test_older_config_layout(tmp_path, rope):
    hf = save_random_llama(tmp_path, rope_parameters=rope)
    edit_config(tmp_path, to_old_rope_layout)
    model = load_model(tmp_path)
    assert model.config.rope_theta == rope["rope_theta"]
    assert_same_logits(hf, model, random_ids(hf.config.vocab_size, (2, 40)))


def test_llama3_scaling_changes_the_logits(tmp_path):
    """Guards the parity tests: dropping the llama3 scaling must be caught by 1e-4."""
    hf = save_random_llama(tmp_path, rope_parameters=LLAMA3_ROPE)
    edit_config(tmp_path, lambda raw: raw["rope_parameters"].update(rope_type="default"))
    ids = random_ids(hf.config.vocab_size, (1, 40))
    with torch.no_grad():
        assert (load_model(tmp_path)(ids) - hf(ids).logits).abs().max().item() > 1e-2


def test_forward_hidden_at_shifted_positions(tmp_path):
    """Rows may start at any position: rotary follows `positions`, not the row index."""
    hf = save_random_llama(tmp_path, rope_parameters=LLAMA3_ROPE)
    model = load_model(tmp_path)
    ids = random_ids(hf.config.vocab_size, (2, 12))
    positions = torch.arange(12).expand(2, 12) + torch.tensor([[5], [30]])
    with torch.no_grad():
        expected = hf(ids, position_ids=positions).logits
        actual = model.compute_logits(model.forward_hidden(ids, positions))
    assert (actual - expected).abs().max().item() < 1e-4


def test_bfloat16_load(tmp_path):
    hf = save_random_llama(tmp_path)
    full = load_model(tmp_path)
    half = load_model(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    assert load_model(tmp_path, dtype="bfloat16").embed_tokens.weight.dtype == torch.bfloat16
    ids = random_ids(hf.config.vocab_size, (2, 24))
    with torch.no_grad():
        expected, actual = full(ids), half(ids)
    assert actual.dtype == torch.bfloat16
    assert (actual.float() - expected).abs().max().item() < 0.1 * expected.abs().max().item()


def test_auto_dtype_keeps_the_checkpoint_dtype(tmp_path):
    save_random_llama(tmp_path).to(torch.bfloat16).save_pretrained(tmp_path)
    assert load_model(tmp_path, dtype="auto").lm_head.weight.dtype == torch.bfloat16
    assert load_model(tmp_path).lm_head.weight.dtype == torch.float32


def test_embedded_model_matches_transformers():
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(embedded_model_path()).float().eval()
    model = load_model()
    ids = random_ids(model.config.vocab_size, (2, 32))
    assert_same_logits(hf, model, ids)
    assert greedy(model, ids[:, :8], 16) == hf_greedy(hf, ids[:, :8], 16)

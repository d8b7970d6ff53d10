"""Config parsing and checkpoint loading: both config layouts, and clear errors that name
the file and the tensor instead of a half-loaded model."""

from __future__ import annotations

import json

import pytest
import torch
from hf_llama import LLAMA3_ROPE, edit_config, save_random_llama
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from llmengine.model.config import LlamaConfig
from llmengine.model.loader import resolve_device
from llmengine.model.tokenizer import load_tokenizer
from llmengine.runner.loading import load_model

BASE = {
    "model_type": "llama",
    "vocab_size": 10,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}


def test_config_defaults():
    config = LlamaConfig.from_dict(BASE)
    assert config.num_key_value_heads == 4
    assert config.head_dim == 4
    assert config.rope_theta == 10000.0 and config.rope_scaling is None
    assert not (config.tie_word_embeddings or config.attention_bias or config.mlp_bias)
    assert config.dtype == torch.float32
    assert config.eos_token_ids == ()


def test_config_eos_list_and_head_dim_override():
    config = LlamaConfig.from_dict(
        {**BASE, "eos_token_id": [7, 9], "head_dim": 8, "num_key_value_heads": 2}
    )
    assert config.eos_token_ids == (7, 9)
    assert config.head_dim == 8 and config.num_key_value_heads == 2
    assert LlamaConfig.from_dict({**BASE, "eos_token_id": 3}).eos_token_ids == (3,)


def test_both_rope_layouts_give_the_same_config():
    new = LlamaConfig.from_dict({**BASE, "rope_parameters": LLAMA3_ROPE})
    old_scaling = {key: value for key, value in LLAMA3_ROPE.items() if key != "rope_theta"}
    old = LlamaConfig.from_dict({**BASE, "rope_theta": 500000.0, "rope_scaling": old_scaling})
    assert new == old
    assert new.rope_theta == 500000.0
    assert new.rope_scaling.original_max_position_embeddings == 16


@pytest.mark.parametrize(
    ("rope", "name"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),
    ],
)
def test_unsupported_rope_type(rope, name):
    with pytest.raises(ValueError, match=f"unsupported rope type '{name}'"):
        LlamaConfig.from_dict({**BASE, **rope})


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "unknown device 'gpu'"),
        ("meta", "unsupported device 'meta'"),
        pytest.param(
            "cuda",
            "torch sees no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has one"),
        ),
        pytest.param(
            f"cuda:{torch.cuda.device_count()}",
            "CUDA device",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ),
    ],
)
def test_a_device_this_machine_lacks_is_refused_before_loading(tmp_path, device, message):
    with pytest.raises(ValueError, match=message):
        load_model(tmp_path / "never-read", device=device)
    assert resolve_device("cpu") == torch.device("cpu")


def test_gpt2_config_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    with pytest.raises(ValueError, match=r"config\.json.*not a Llama"):
        load_model(tmp_path)


def test_config_missing_keys_names_the_file(tmp_path):
    config = {key: value for key, value in BASE.items() if key != "hidden_size"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*hidden_size"):
        load_model(tmp_path)


def rewrite_weights(folder, edit) -> None:
    """Load `model.safetensors`, let `edit(dict)` change it, save it back."""
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    save_random_llama(tmp_path)
    rewrite_weights(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.safetensors.*model\.layers\.1\.mlp\.up_proj"):
        load_model(tmp_path)


def test_wrong_shape(tmp_path):
    save_random_llama(tmp_path)
    rewrite_weights(
        tmp_path, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(4, 32)})
    )
    with pytest.raises(ValueError, match=r"model\.safetensors.*self_attn\.k_proj\.weight.*shape"):
        load_model(tmp_path)


def test_config_disagreeing_with_weights(tmp_path):
    """A config with fewer KV heads than the weights were trained with fails on the shape."""
    save_random_llama(tmp_path, num_key_value_heads=2)
    edit_config(tmp_path, lambda raw: raw.update(num_key_value_heads=1))
    with pytest.raises(ValueError, match="k_proj"):
        load_model(tmp_path)


def test_unexpected_tensor_rejected_rotary_cache_ignored(tmp_path):
    save_random_llama(tmp_path)
    rewrite_weights(
        tmp_path,
        lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}),
    )
    load_model(tmp_path)
    rewrite_weights(tmp_path, lambda t: t.update({"model.layers.0.extra.weight": torch.ones(4)}))
    with pytest.raises(ValueError, match=r"model\.safetensors.*layers\.0\.extra\.weight"):
        load_model(tmp_path)


def test_tied_checkpoint_without_and_with_lm_head(tmp_path):
    hf = save_random_llama(tmp_path, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = load_model(tmp_path)
    assert model.lm_head is None
    rewrite_weights(tmp_path, lambda t: t.update({"lm_head.weight": hf.lm_head.weight.clone()}))
    assert load_model(tmp_path).lm_head is None


def test_sharded_checkpoint_missing_shard(tmp_path):
    save_random_llama(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ValueError, match=shard.name):
        load_model(tmp_path)


def test_loaded_model_is_for_inference(tmp_path):
    save_random_llama(tmp_path)
    model = load_model(tmp_path)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_load_tokenizer_from_folder(tmp_path):
    vocab = {"[UNK]": 0, "to": 1, "be": 2, "or": 3, "not": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("to be or not to be") == [1, 2, 3, 4, 1, 2]
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nowhere")

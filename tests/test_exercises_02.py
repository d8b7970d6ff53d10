"""Lesson 02's exercise checkers: the right answer, found here another way (the file's own
header, a refusal raised here), is right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from safetensors import safe_open

import llmengine
from llmengine.lessons.exercises.lesson_02 import (
    check_a_change_the_loader_accepts,
    check_tensor_named_for_two_kv_heads,
    check_tensors_in_a_six_layer_file,
)
from llmengine.model.loader import embedded_model_path


def test_tensors_in_a_six_layer_file() -> None:
    with safe_open(embedded_model_path() / "model.safetensors", framework="pt") as handle:
        names = list(handle.keys())
    per_layer = sum(name.startswith("model.layers.0.") for name in names)
    outside = sum(".layers." not in name for name in names)
    expected = 6 * per_layer + outside
    assert check_tensors_in_a_six_layer_file(expected).right is True
    assert check_tensors_in_a_six_layer_file(len(names)).right is False
    assert check_tensors_in_a_six_layer_file(None).right is None


def test_tensor_named_for_two_kv_heads(tmp_path) -> None:
    shutil.copytree(embedded_model_path(), tmp_path / "two-kv-heads")
    config_path = tmp_path / "two-kv-heads" / "config.json"
    config_path.write_text(
        json.dumps(json.loads(config_path.read_text()) | {"num_key_value_heads": 2})
    )
    with contextlib.chdir(tmp_path), pytest.raises(ValueError) as refusal:
        llmengine.load_model("two-kv-heads", kernels="eager")
    name = "model.layers.0.self_attn.k_proj.weight"
    assert f"tensor {name!r}" in str(refusal.value)
    assert check_tensor_named_for_two_kv_heads(name).right is True
    assert check_tensor_named_for_two_kv_heads(name.removeprefix("model.")).right is True
    assert (
        check_tensor_named_for_two_kv_heads("model.layers.0.self_attn.v_proj.weight").right is False
    )
    assert check_tensor_named_for_two_kv_heads(None).right is None


def test_a_change_the_loader_accepts() -> None:
    assert check_a_change_the_loader_accepts({"rms_norm_eps": 0.5}).right is True
    assert check_a_change_the_loader_accepts({"hidden_size": 128}).right is False  # refused
    unchanged = check_a_change_the_loader_accepts({"max_position_embeddings": 1024})
    assert unchanged.right is False and "same bits" in unchanged.message
    assert check_a_change_the_loader_accepts(None).right is None

"""Lesson 02's exercises: what a checkpoint file holds, which tensor a refusal names, and what
the loader's checks cannot see.

The checkers build what the question describes (a model on the `meta` device, or a copy of
the embedded checkpoint with an edited `config.json` in a temporary folder) and load or count
it the way the lesson does.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from llmengine.lessons.exercises import Verdict, check_value, check_with
from llmengine.lessons.exercises.lesson_01 import embedded_config
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.model.loader import checkpoint_name, embedded_model_path
from llmengine.model.tokenizer import load_tokenizer
from llmengine.runner.loading import load_model

LINE = "ROMEO:\nBut soft, what light through yonder window breaks?"


def checkpoint_tensor_names(config: LlamaConfig) -> list[str]:
    """The tensors a checkpoint for `config` holds, in the order the loader checks them."""
    with torch.device("meta"):
        model = Llama(config)
    return [checkpoint_name(name) for name, _ in model.named_parameters()]


def load_edited_copy(changes: Mapping[str, Any]) -> tuple[torch.Tensor | None, str]:
    """Copy the embedded checkpoint with `changes` applied to its `config.json` and load it
    (`kernels="eager"`). Returns the copy's logits for the lesson's line and "" when it loads,
    or None and the `ValueError`'s message, from inside the temporary folder, when refused."""
    source = embedded_model_path()
    with tempfile.TemporaryDirectory() as workdir:
        target = Path(workdir) / "edited"
        shutil.copytree(source, target)
        config = json.loads((target / "config.json").read_text())
        config.update(changes)
        (target / "config.json").write_text(json.dumps(config))
        try:
            model = load_model(target, kernels="eager")
        except ValueError as error:
            return None, str(error).replace(f"{workdir}/", "")
    ids = torch.tensor([load_tokenizer().encode(LINE)])
    with torch.no_grad():
        return model(ids), ""


@functools.cache
def embedded_logits() -> torch.Tensor:
    """The embedded model's logits for the lesson's line, loaded as the copies are."""
    ids = torch.tensor([load_tokenizer().encode(LINE)])
    with torch.no_grad():
        return load_model(kernels="eager")(ids)


def refused_tensor(changes: Mapping[str, Any]) -> str | None:
    """The tensor named in the loader's refusal of a copy edited by `changes` (None if it loads,
    or if the refusal names no tensor)."""
    logits, message = load_edited_copy(changes)
    if logits is not None or "tensor '" not in message:
        return None
    return message.split("tensor '", 1)[1].split("'", 1)[0]


def check_tensors_in_a_six_layer_file(answer: int | None) -> Verdict:
    """Exercise 1: how many tensors the file of a 6-layer version of the embedded model holds."""
    expected = len(checkpoint_tensor_names(embedded_config(num_hidden_layers=6)))
    return check_value(
        answer,
        expected,
        what="the number of tensors in a 6-layer checkpoint",
        explain="Nine per layer, plus the embedding and the final norm; the head is tied.",
    )


def check_tensor_named_for_two_kv_heads(answer: str | None) -> Verdict:
    """Exercise 2: the tensor the loader names when `config.json` says 2 K/V heads."""
    expected = refused_tensor({"num_key_value_heads": 2})

    def judge(name: str) -> tuple[bool, str]:
        right = name in (expected, expected.removeprefix("model."))
        if right:
            return True, (
                f"the loader names {expected!r}: it checks the tensors in the model's own "
                "order, and the first one whose shape depends on the K/V heads is layer 0's "
                "k_proj."
            )
        return False, f"the loader does not name {name!r} first."

    return check_with(answer, judge, what="the tensor the refusal names")


def check_a_change_the_loader_accepts(answer: Mapping[str, Any] | None) -> Verdict:
    """Exercise 3: a `config.json` change that loads without complaint yet changes the logits."""

    def judge(changes: Mapping[str, Any]) -> tuple[bool, str]:
        embedded = embedded_logits()
        logits, message = load_edited_copy(changes)
        if logits is None:
            return False, f"the loader refuses it: {message}."
        if torch.equal(logits, embedded):
            return False, "it loads, but the logits are the same bits: the model is unchanged."
        moved = (logits - embedded).abs().max().item()
        return True, (
            f"it loads without a word, and the largest logit moves by {moved:.3f}: the loader "
            "checks names and shapes, and a number that shapes no tensor passes unseen."
        )

    return check_with(answer, judge, what="a change the loader accepts")

"""Random Llama checkpoints built with transformers, the reference the tests compare against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers

from llmengine.bench.throughput import save_random_checkpoint

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


# A tiny shape every test can afford. The large `initializer_range` makes greedy
# continuations varied instead of one token repeated, far from argmax ties.
TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 101,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.3,
    "tie_word_embeddings": False,
}


def save_random_llama(
    folder: Path, *, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
) -> transformers.LlamaForCausalLM:
    """`save_random_checkpoint` at the `TINY_LLAMA` shape (plus `overrides`): a seeded
    `LlamaForCausalLM` saved to `folder`, returned in eval mode."""
    settings: dict[str, Any] = {**TINY_LLAMA, **overrides}
    return save_random_checkpoint(folder, seed=seed, max_shard_size=max_shard_size, **settings)


def edit_config(folder: Path, edit: Any) -> None:
    """Rewrite `folder/config.json` through `edit(dict)`, which changes it in place."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def to_old_rope_layout(raw: dict[str, Any]) -> None:
    """Move `rope_parameters` to the pre-transformers-5 `rope_theta` + `rope_scaling` keys."""
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = None if params["rope_type"] == "default" else params


def hf_greedy(
    model: transformers.LlamaForCausalLM, prompt: torch.Tensor, steps: int
) -> list[list[int]]:
    """Transformers' own greedy generation, never stopping early at an end token.

    The mask is explicit: without it generate() takes every `pad_token_id` in the prompt for
    padding, and prompts here may contain that id (the embedded model's BOS is 0).
    """
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=steps,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, prompt.shape[1] :].tolist()


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> list[list[int]]:
    """Greedy continuation by re-running the whole sequence each step (no cache)."""
    ids = prompt
    for _ in range(steps):
        next_ids = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat((ids, next_ids), dim=1)
    return ids[:, prompt.shape[1] :].tolist()


def save_word_level_tokenizer(folder: Path, words: list[str], decoder: Any = None) -> None:
    """A whitespace word-level tokenizer over `words` (id = index), saved by transformers the
    way a checkpoint's is. `words` starts with `<unk>`, `<s>` and `</s>`, which become the
    unknown, BOS and EOS tokens. With no `decoder` (a `tokenizers.decoders` object), decoding
    joins tokens with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if decoder is not None:
        backend.decoder = decoder
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)

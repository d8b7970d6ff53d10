"""One decode step through the paged cache against the contiguous one, same model, same K/V.

Both caches are filled with the same random K/V for `context` earlier positions of every
row (the values do not matter for the time, and filling them by prefill would cost far more
than the steps measured), the paged one through shuffled block ids so its tables are not
secretly contiguous. A step then feeds one token per row and returns the logits; the
contiguous cache's lengths are rewound after each call so every repetition does the same
work. Both steps compute the same logits, which a test checks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.contiguous_cache import ContiguousKVCache, contiguous_forward
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.runner.attention import PagedRow, flat_indices
from llmengine.runner.forward import paged_forward

# A ~30M-parameter Llama shape (random weights): large enough that matrix work, not Python,
# dominates a step on a CPU; small enough to build in a second. Written in config.json terms
# so that transformers builds the same shape for the throughput comparison.
BENCH_SHAPE: dict[str, Any] = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
BENCH_CONFIG = LlamaConfig.from_dict({"model_type": "llama", **BENCH_SHAPE}, source="BENCH_SHAPE")
# The held-out shape: the same layers with a 2048-token vocabulary (~25M parameters), a
# shape nobody tuned for, whose output head weighs less against the layers.
HELD_OUT_SHAPE: dict[str, Any] = {**BENCH_SHAPE, "vocab_size": 2048}
HELD_OUT_CONFIG = LlamaConfig.from_dict(
    {"model_type": "llama", **HELD_OUT_SHAPE}, source="HELD_OUT_SHAPE"
)
# A ~100M shape: a Llama-2-sized vocabulary (whose output head is a quarter of the
# weights), tied embeddings, three query heads to each KV head.
SHAPE_100M: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
SHAPE_100M_CONFIG = LlamaConfig.from_dict(
    {"model_type": "llama", **SHAPE_100M}, source="SHAPE_100M"
)


def random_llama(config: LlamaConfig = BENCH_CONFIG, seed: int = 0, std: float = 0.02) -> Llama:
    """A Llama with seeded normal(0, `std`) weights (norms stay 1), eval mode, no gradients."""
    torch.manual_seed(seed)
    model = Llama(config)
    for name, parameter in model.named_parameters():
        if "norm" not in name:
            nn.init.normal_(parameter, std=std)
    return model.eval().requires_grad_(False)


@dataclass(slots=True)
class DecodeSteps:
    """Ready-to-call decode steps over the two caches holding the same K/V."""

    contiguous: Callable[[], torch.Tensor]
    paged: Callable[[], torch.Tensor]


def prepare_decode_steps(
    model: Llama, batch: int, context: int, block_size: int = 16, seed: int = 0
) -> DecodeSteps:
    """Fill both caches with `context` positions per row; return one-token decode steps.

    Each step returns the logits `[batch, vocab]` of the new position `context` of every row.
    """
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    parameter = next(model.parameters())
    dtype, device = parameter.dtype, parameter.device
    shape = (config.num_hidden_layers, batch, context, config.num_key_value_heads, config.head_dim)
    keys = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    values = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    tokens = torch.randint(0, config.vocab_size, (batch, 1), generator=generator).to(device)

    contiguous = ContiguousKVCache(config, batch, context + 1, dtype=dtype, device=device)
    for layer in range(config.num_hidden_layers):
        contiguous.keys[layer][:, :context] = keys[layer]
        contiguous.values[layer][:, :context] = values[layer]

    per_row = blocks_for_length(context + 1, block_size)
    order = torch.randperm(batch * per_row, generator=generator)
    tables = order.view(batch, per_row)
    paged = PagedKVCache(config, batch * per_row, block_size, dtype=dtype, device=device)
    indices = flat_indices(tables, torch.arange(context).expand(batch, -1), block_size)
    for layer in range(config.num_hidden_layers):
        paged.write(
            layer,
            indices.flatten().to(device),
            keys[layer].flatten(0, 1),
            values[layer].flatten(0, 1),
        )
    rows = [PagedRow([int(t)], context, tables[row].tolist()) for row, t in enumerate(tokens[:, 0])]

    def contiguous_step() -> torch.Tensor:
        contiguous.lengths[:] = [context] * batch
        return contiguous_forward(model, contiguous, tokens)[:, -1]

    def paged_step() -> torch.Tensor:
        return paged_forward(model, paged, rows)

    return DecodeSteps(contiguous=contiguous_step, paged=paged_step)


def _seconds(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


@dataclass(frozen=True, slots=True)
class DecodeTiming:
    """Median seconds of one decode step through each cache, for one batch and context."""

    batch: int
    context: int
    contiguous_s: float
    paged_s: float

    @property
    def ratio(self) -> float:
        """Paged time over contiguous time: above 1 means paging costs extra."""
        return self.paged_s / self.contiguous_s


def time_decode_step(
    model: Llama, batch: int, context: int, block_size: int = 16, repeats: int = 7, warmup: int = 2
) -> DecodeTiming:
    """Prepare both caches and time one decode step through each (median of `repeats`).

    The two are timed in turn, one call each, so a machine that slows down for a while
    (other jobs on shared cores) slows both alike; `warmup` untimed rounds go first.
    """
    steps = prepare_decode_steps(model, batch, context, block_size)
    with torch.inference_mode():
        for _ in range(warmup):
            steps.contiguous()
            steps.paged()
        pairs = [(_seconds(steps.contiguous), _seconds(steps.paged)) for _ in range(repeats)]
    return DecodeTiming(
        batch,
        context,
        statistics.median(pair[0] for pair in pairs),
        statistics.median(pair[1] for pair in pairs),
    )

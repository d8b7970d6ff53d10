"""A decode step whose every shape is fixed per batch bucket: what a CUDA graph captures.

The step reads its inputs from the bucket's `StepBuffers` only, writes the new K/V into the
cache in place, and attends in one of two ways (`ATTENTION`):

- `paged`: `llmengine.runner.paged_decode`'s Triton kernel reads each row's own blocks
  where they lie in the cache, as many as its length needs (the CUDA default when Triton
  is installed);
- `gathered`: each row's keys are gathered through its block table into `[rows, width *
  block_size]`, as wide as the table whatever the row's length, and the positions at or
  past its length are masked out with an additive float mask (-inf), so SDPA sees the same
  shapes every step. Plain torch: it runs wherever torch does.

The same function runs eagerly (on a CPU, where the tests compare its tokens with the eager
engine's) and under `torch.cuda.graph` capture (`llmengine.runner.cuda_graphs`): nothing
in it syncs with the host or makes a tensor from Python data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.runner import paged_decode
from llmengine.runner.step_buffers import StepBuffers
from llmengine.sampling import greedy_picks

# On CUDA: the memory-efficient kernel takes an additive mask and has no per-shape plan to
# build (cuDNN's would be built at warm-up and replayed, but is not needed); math is its
# fallback where a shape does not suit it.
CUDA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PAGED, GATHERED = "paged", "gathered"
ATTENTION = (PAGED, GATHERED)


class PagedStaticAttention:
    """The `AttentionHook` of a static decode step that reads K/V in place: each layer
    writes the new K/V at the rows' write slots of the pool, then the paged kernel attends
    over each row's first `length` positions through its block table."""

    def __init__(self, cache: PagedKVCache, buffers: StepBuffers) -> None:
        self.cache, self.buffers = cache, buffers

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cache, buffers = self.cache, self.buffers
        cache.write(layer_index, buffers.write_slots, k[:, 0], v[:, 0])
        return paged_decode.paged_decode_attention(
            q.contiguous(),
            cache.keys[layer_index].flatten(0, 1),
            cache.values[layer_index].flatten(0, 1),
            buffers.block_tables,
            buffers.lengths,
            cache.block_size,
        )


class GatheredStaticAttention:
    """The `AttentionHook` of a static decode step: each layer writes the new K/V at the
    rows' write slots of the pool, gathers every row's `width` blocks and attends over
    them under the length mask. The gather indices and the mask are made once per step."""

    def __init__(self, cache: PagedKVCache, buffers: StepBuffers, dtype: torch.dtype) -> None:
        block_size = cache.block_size
        self.cache, self.write_slots = cache, buffers.write_slots
        offsets = torch.arange(block_size, device=cache.device)
        num_keys = buffers.width * block_size
        shape = (buffers.bucket, num_keys)
        self.slots = (buffers.block_tables[:, :, None] * block_size + offsets).reshape(shape)
        visible = torch.arange(num_keys, device=cache.device) < buffers.lengths[:, None]
        self.mask = torch.zeros(shape, dtype=dtype, device=cache.device)
        self.mask.masked_fill_(~visible, float("-inf"))
        self.mask = self.mask[:, None, None, :]  # [rows, 1, 1, keys]: every head, every query

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.cache.write(layer_index, self.write_slots, k[:, 0], v[:, 0])
        gathered_keys, gathered_values = self.cache.gather(layer_index, self.slots)
        return grouped_decode_attention(q, gathered_keys, gathered_values, self.mask)


def grouped_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Attention `[B, 1, heads, head_dim]` of one query per row over `keys`/`values`
    `[B, keys, kv_heads, head_dim]` under the additive `mask` `[B, 1, 1, keys]`.

    The query heads that share a K/V head become that head's queries (query head h reads
    K/V head h // group, as grouped-query attention has it): one product per K/V head,
    and no copy of K/V repeated per query head.
    """
    rows, _, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    grouped = q.view(rows, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        grouped, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask
    )
    return out.reshape(rows, 1, heads, head_dim)


def static_decode_step(
    model: Llama,
    cache: PagedKVCache,
    buffers: StepBuffers,
    dtype: torch.dtype,
    attention: str = GATHERED,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits `[bucket, vocab]` of one decode step over the bucket's buffers, the new K/V of
    every row (padding rows' into the scratch block) written into `cache`, and their greedy
    picks `[2, bucket]` (`greedy_picks`), computed in the same graph; `attention` is one of
    `ATTENTION` (the module's docstring)."""
    if attention == PAGED:
        return _forward(model, buffers, PagedStaticAttention(cache, buffers))
    hook = GatheredStaticAttention(cache, buffers, dtype)
    if cache.device.type != "cuda":
        return _forward(model, buffers, hook)
    with sdpa_kernel(CUDA_BACKENDS):
        return _forward(model, buffers, hook)


def _forward(
    model: Llama, buffers: StepBuffers, attention: GatheredStaticAttention | PagedStaticAttention
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = model.forward_hidden(buffers.token_ids[:, None], buffers.positions[:, None], attention)
    logits = model.compute_logits(hidden[:, 0])
    return logits, greedy_picks(logits)

"""The simplest KV cache: one preallocated region of `max_seq_len` positions per sequence.

Each forward computes only the new positions: their K/V are written after the row's earlier
ones, and their queries attend over everything the row holds. Simple and fast to index, but
every row reserves `max_seq_len` positions up front, so a short sequence wastes the rest:
the waste the paged cache removes.
"""

from __future__ import annotations

import torch

from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama, causal_mask, grouped_query_attention


def zeroed_kv(
    config: LlamaConfig,
    slots: tuple[int, int],
    dtype: torch.dtype,
    device: str | torch.device,
    pin_memory: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Keys and values, one zero-filled `[*slots, kv_heads, head_dim]` tensor per layer each.

    Both caches store K/V this way, differing only in `slots`: `(rows, positions)` here,
    `(blocks, block_size)` in the paged cache. Zeros, not `torch.empty`: a masked-out entry
    still enters attention as `0 * value`, and uninitialised memory could hold NaN, which
    survives that multiplication.
    """
    shape = (*slots, config.num_key_value_heads, config.head_dim)

    def per_layer() -> list[torch.Tensor]:
        return [
            torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
            for _ in range(config.num_hidden_layers)
        ]

    return per_layer(), per_layer()


class ContiguousKVCache:
    """Per layer K/V `[max_batch, max_seq_len, kv_heads, head_dim]`; a filled length per row."""

    def __init__(
        self,
        config: LlamaConfig,
        max_batch: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.keys, self.values = zeroed_kv(config, (max_batch, max_seq_len), dtype, device)
        self.max_seq_len = max_seq_len
        self.lengths = [0] * max_batch

    def reset(self, row: int | None = None) -> None:
        """Forget one row (or every row): its positions will be overwritten by the next prompt."""
        rows = range(len(self.lengths)) if row is None else [row]
        for index in rows:
            self.lengths[index] = 0


class ContiguousAttention:
    """The `AttentionHook` of one forward: rows `rows` each append `S` positions."""

    def __init__(self, cache: ContiguousKVCache, rows: list[int], seq_len: int) -> None:
        device = cache.keys[0].device
        starts = torch.tensor([cache.lengths[row] for row in rows], device=device)
        self.cache = cache
        self.rows = torch.tensor(rows, device=device)
        self.positions = starts[:, None] + torch.arange(seq_len, device=device)
        self.num_keys = max(cache.lengths[row] for row in rows) + seq_len
        self.mask = causal_mask(self.positions, self.num_keys)

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        keys, values = self.cache.keys[layer_index], self.cache.values[layer_index]
        keys[self.rows[:, None], self.positions] = k
        values[self.rows[:, None], self.positions] = v
        held_keys = keys[self.rows, : self.num_keys]
        held_values = values[self.rows, : self.num_keys]
        return grouped_query_attention(q, held_keys, held_values, mask=self.mask)


def contiguous_forward(
    model: Llama,
    cache: ContiguousKVCache,
    input_ids: torch.Tensor,
    rows: list[int] | None = None,
) -> torch.Tensor:
    """Append `input_ids` `[B, S]` to cache rows `rows` (default 0..B-1); logits `[B, S, vocab]`.

    Every row in one call adds the same number of tokens, each after its own cached
    length: prefill rows of different lengths one call each, then decode them together.
    """
    rows = list(range(input_ids.shape[0])) if rows is None else rows
    seq_len = input_ids.shape[1]
    for row in rows:
        if cache.lengths[row] + seq_len > cache.max_seq_len:
            raise ValueError(
                f"row {row} holds {cache.lengths[row]} positions; {seq_len} more exceed "
                f"max_seq_len {cache.max_seq_len}"
            )
    attention = ContiguousAttention(cache, rows, seq_len)
    hidden = model.forward_hidden(input_ids, attention.positions, attention)
    for row in rows:
        cache.lengths[row] += seq_len
    return model.compute_logits(hidden)

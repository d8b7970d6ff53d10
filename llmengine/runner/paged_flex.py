"""Decode attention that reads K/V where it lives: `flex_attention` over the whole pool.

The pool is one long key sequence to `flex_attention`, and a block mask built from each
row's block table names the blocks that row may read (its full blocks, then its partly
filled last one), so the kernel visits those blocks in place instead of copying every key
into a `[rows, keys]` tensor first, as `GatheredAttention` does (measured in
reports/wallclock/paged-attention.md). Every tensor's shape depends on the number of rows
and the pool's size alone, whatever the context length: what a graph compiled once per
batch bucket needs (`llmengine.runner.graphs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention


def paged_block_mask(tensors: Sequence[torch.Tensor], num_slots: int, group: int = 1) -> BlockMask:
    """The `flex_attention` block mask over a pool of `num_slots` from its tensors
    (`llmengine.runner.flex_inputs`: built outside the graph, since inductor's CPU flex
    template found no kernel when these index tensors were computed inside it), for `group`
    query positions per row: the query heads that share one K/V head
    (`paged_decode_attention`).

    The block lists make the compiled kernel visit only a row's own blocks; the mask function
    states the whole rule (the slot's block is the row's, and its position precedes the row's
    end), so the mask is also right where flex_attention runs uncompiled, over every slot.
    """
    partial_blocks, partial_tables, full_blocks, block_tables, ends, table_places = tensors
    block_size = num_slots // block_tables.shape[1]

    def sees(b, h, q, slot):
        place = table_places[b, slot // block_size]
        return (place >= 0) & (place * block_size + slot % block_size < ends[b])

    return BlockMask.from_kv_blocks(
        partial_blocks[:, None, None],
        partial_tables[:, None, None],
        full_blocks[:, None, None],
        block_tables[:, None, None],
        BLOCK_SIZE=(group, block_size),
        mask_mod=sees,
        seq_lengths=(group, num_slots),
        compute_q_blocks=False,
    )


class FlexPagedAttention:
    """The `AttentionHook` of a decode step of one query per row: each layer writes the new
    K/V at `write_indices` of the flat pool (`[slots, kv_heads, head_dim]` per layer), then
    attends over the pool in place through `block_mask`."""

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        write_indices: torch.Tensor,
        block_mask: BlockMask,
    ) -> None:
        self.keys, self.values = keys, values
        self.write_indices = write_indices
        self.block_mask = block_mask

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        keys, values = self.keys[layer_index], self.values[layer_index]
        keys.index_copy_(0, self.write_indices, k[:, 0])
        values.index_copy_(0, self.write_indices, v[:, 0])
        return paged_decode_attention(q, keys, values, self.block_mask)


def paged_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_mask: BlockMask
) -> torch.Tensor:
    """Attention `[B, 1, heads, head_dim]` of one query per row over the pool `[slots, kv_heads,
    head_dim]`, read in place through `block_mask` (one batch view of the pool per row), made
    with `group` = heads / kv_heads.

    The query heads that share a K/V head reach the kernel as that head's query positions,
    `[B, kv_heads, group, head_dim]`, rather than as heads of their own (`enable_gqa`): the
    kernel then reads each block of keys once per K/V head and multiplies it by `group`
    queries at once, instead of reading it once per query head
    (reports/wallclock/paged-attention.md)."""
    rows, _, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    out = flex_attention(
        q[:, 0].reshape(rows, kv_heads, heads // kv_heads, head_dim),
        keys.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        values.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        block_mask=block_mask,
    )
    return out.reshape(rows, 1, heads, head_dim)  # type: ignore[union-attr]

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
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from llmengine.runner.attention import PagedRow, block_table_tensor


def block_mask_tensors(
    ends: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, ...]:
    """What `paged_block_mask` builds its mask from, for rows whose queries see positions
    `0 .. ends[b] - 1` through `block_tables` `[B, width]` (the cache's block count).

    Those positions lie in the first `ceil(ends / block_size)` blocks of a row's table: the
    `ends // block_size` full ones are read whole (no mask evaluated), and a last, partly
    filled block only up to its fill. Computed outside the graph: inductor's CPU flex
    template found no kernel when these index tensors were computed inside it.
    """
    rows, width = block_tables.shape
    full_blocks = (ends // block_size).to(torch.int32)
    partial_blocks = (ends % block_size > 0).to(torch.int32)
    last = block_tables.gather(1, full_blocks.clamp(max=width - 1)[:, None].long())
    partial_tables = F.pad(last, (0, width - 1)).to(torch.int32)
    # Each pool block's place in the row's table (-1: not the row's), for the mask function.
    used = torch.arange(width, device=ends.device) < (full_blocks + partial_blocks)[:, None]
    places = torch.arange(width, device=ends.device).expand(rows, -1)
    table_places = torch.full((rows, width + 1), -1, dtype=torch.long, device=ends.device)
    table_places.scatter_(1, torch.where(used, block_tables, width), places)
    return (
        partial_blocks,
        partial_tables,
        full_blocks,
        block_tables.to(torch.int32),
        ends,
        table_places[:, :width],
    )


def paged_block_mask(tensors: Sequence[torch.Tensor], num_slots: int) -> BlockMask:
    """The `flex_attention` block mask of `block_mask_tensors` over a pool of `num_slots`.

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
        BLOCK_SIZE=(1, block_size),
        mask_mod=sees,
        seq_lengths=(1, num_slots),
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
    head_dim]`, read in place through `block_mask` (one batch view of the pool per row)."""
    rows = q.shape[0]
    out = flex_attention(
        q.transpose(1, 2),
        keys.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        values.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        block_mask=block_mask,
        enable_gqa=q.shape[2] != keys.shape[1],
    )
    return out.transpose(1, 2)  # type: ignore[union-attr]


# A decode graph's inputs: token ids, positions, write slots and the block mask's tensors.
DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]


def decode_inputs(
    rows: Sequence[PagedRow],
    block_size: int,
    num_blocks: int,
    bucket: int,
    scratch_block: int,
    device: torch.device,
) -> DecodeInputs:
    """The graph's inputs for decode `rows` padded to `bucket` rows, in a cache of
    `num_blocks` blocks: token ids, positions, write slots and the block mask's tensors, whose
    tables are `num_blocks` wide whatever the rows' lengths (padded with block 0, never read:
    a row reads only its first blocks), so that every shape depends on the bucket alone.

    Padding rows stand at position 0 of `scratch_block`: they write and read its first slot.
    """
    token_ids = torch.tensor([row.token_ids[0] for row in rows], device=device)
    positions = torch.tensor([row.start_position for row in rows], device=device)
    tables = block_table_tensor(list(rows), block_size, device)
    write = tables.gather(1, (positions // block_size)[:, None])[:, 0] * block_size
    write += positions % block_size
    tables = F.pad(tables, (0, num_blocks - tables.shape[1]))
    pad = bucket - len(rows)
    if pad:
        token_ids = F.pad(token_ids, (0, pad))
        positions = F.pad(positions, (0, pad))
        write = F.pad(write, (0, pad), value=scratch_block * block_size)
        tables = torch.cat([tables, tables.new_full((pad, num_blocks), scratch_block)])
    return token_ids, positions, write, block_mask_tensors(positions + 1, tables, block_size)

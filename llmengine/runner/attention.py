"""Attention over the paged cache by gathering: each row's K/V copied out of its blocks.

One forward serves rows of different lengths (prefills and decodes together): the new tokens
of every row are packed into one sequence, so the projections and the MLP compute exactly the
real positions and no pad. Attention runs once per group of rows with the same number of new
positions, each group as a `[rows, new]` query batch: all rows when every row computes the same
number (the packed sequence is then that batch, read without a copy), else the decode rows
together and every prefill row alone, so no decode query is padded to a prefill's length. A
group reads its rows' K/V position by position through flat indices, as `[rows, longest end]`
keys (reading whole blocks instead is slower: it copies the unused tail of every last block
too); a mask hides the keys past each query's position. On CUDA, SDPA runs only on backends
that keep no plan per shape (`attention_without_cudnn`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import causal_mask, grouped_query_attention


@dataclass(slots=True)
class PagedRow:
    """One sequence's share of a forward."""

    token_ids: list[int]  # tokens of the positions computed now
    start_position: int  # position of token_ids[0]; K/V of earlier positions is already cached
    block_ids: list[int]  # the block table, covering start_position + len(token_ids) positions


class GatheredAttention:
    """The `AttentionHook` of one paged forward: K/V gathered out of the blocks, then SDPA.

    Each layer writes the new K/V into the cache's blocks, copies every row's K/V out of them
    into a dense `[rows, keys]` batch (`PagedKVCache.gather`) and attends over that copy with
    one SDPA call per `_RowGroup`; no kernel here reads the blocks in place. The index tensors
    are built once for all layers. The model sees the new tokens packed as one sequence
    `[1, N]`; a group is every row when all compute the same number of positions (the packed
    order is then the batch, so nothing is scattered), else the decode rows together and each
    prefill row alone, so no row's queries are padded to another row's length.
    """

    def __init__(self, cache: PagedKVCache, rows: list[PagedRow]) -> None:
        device, block_size = cache.device, cache.block_size
        new_lengths = [len(row.token_ids) for row in rows]
        first_tokens = list(accumulate(new_lengths, initial=0))
        self.cache = cache
        self.groups = [
            _RowGroup(
                [rows[i] for i in group], [first_tokens[i] for i in group], block_size, device
            )
            for group in _row_groups(new_lengths)
        ]
        num_tokens = first_tokens[-1]
        positions = torch.empty(num_tokens, dtype=torch.long, device=device)
        self.write_indices = torch.empty(num_tokens, dtype=torch.long, device=device)
        for group in self.groups:
            positions[group.tokens] = group.query_positions.flatten()
            self.write_indices[group.tokens] = flat_indices(
                group.block_table, group.query_positions, block_size
            ).flatten()
        self.positions = positions[None]
        self.last_new = torch.tensor(
            [first - 1 for first in first_tokens[1:]], dtype=torch.long, device=device
        )

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.cache.write(layer_index, self.write_indices, k[0], v[0])
        if len(self.groups) == 1:
            return self.groups[0].attend(self.cache, layer_index, q[0]).reshape(q.shape)
        out = q.new_empty(q.shape[1:])
        for group in self.groups:
            out[group.tokens] = group.attend(self.cache, layer_index, q[0])
        return out[None]


def _row_groups(new_lengths: list[int]) -> list[list[int]]:
    """Which rows share an SDPA call, by row index: all rows when their new lengths agree, else
    the decode rows (one new position) together and every other row alone."""
    if len(set(new_lengths)) == 1:
        return [list(range(len(new_lengths)))]
    decodes = [index for index, length in enumerate(new_lengths) if length == 1]
    others = [[index] for index, length in enumerate(new_lengths) if length != 1]
    return [decodes, *others] if decodes else others


class _RowGroup:
    """Rows with the same number `n` of new positions, attended by one SDPA call.

    Queries are `[rows, n]`; keys are positions 0 up to the longest end among the rows, read
    out of the pool by one flat index each (`read_indices`, built once per step). The mask
    hides the keys past each query's position, which covers a shorter row's tail. It is
    dropped when every row ends at the last key and either decodes one position (it would
    hide nothing) or starts at 0 (it is plain causal).
    """

    def __init__(
        self,
        rows: list[PagedRow],
        first_tokens: list[int],
        block_size: int,
        device: torch.device,
    ) -> None:
        new_length = len(rows[0].token_ids)
        self.shape = (len(rows), new_length)
        self.block_table = block_table_tensor(rows, block_size, device)
        ends = [row.start_position + new_length for row in rows]
        self.num_keys = max(ends)
        positions = [
            list(range(row.start_position, end)) for row, end in zip(rows, ends, strict=True)
        ]
        self.query_positions = torch.tensor(positions, dtype=torch.long, device=device)
        key_positions = torch.arange(self.num_keys, device=device).expand(len(rows), -1)
        self.read_indices = flat_indices(self.block_table, key_positions, block_size)
        # The packed tokens of these rows: a slice (a view, no copy) when they lie together.
        first, count = first_tokens[0], len(rows) * new_length
        self.tokens: slice | torch.Tensor = slice(first, first + count)
        if first_tokens != list(range(first, first + count, new_length)):
            indices = [start + offset for start in first_tokens for offset in range(new_length)]
            self.tokens = torch.tensor(indices, dtype=torch.long, device=device)
        self.mask: torch.Tensor | None = None
        self.is_causal = False
        if all(end == self.num_keys for end in ends) and new_length in (1, self.num_keys):
            self.is_causal = new_length > 1
        else:
            self.mask = causal_mask(self.query_positions, self.num_keys)

    def attend(self, cache: PagedKVCache, layer_index: int, queries: torch.Tensor) -> torch.Tensor:
        """This group's outputs `[rows * n, heads, head_dim]` from the packed `queries`."""
        q = queries[self.tokens].reshape(*self.shape, *queries.shape[1:])
        keys, values = cache.gather(layer_index, self.read_indices)
        attention = sdpa_for(q.device)
        out = attention(q, keys, values, mask=self.mask, is_causal=self.is_causal)
        return out.flatten(0, 1)


# Left to itself, SDPA on a CUDA device may pick cuDNN, which builds an execution plan for every
# new shape: 3-4 ms a call on an H200, 16 calls a step, and the decode's key length is a new
# shape every step. Flash and memory-efficient attention launch fixed kernels for any length;
# flash takes no mask, memory-efficient takes any mask but only as many K/V heads as query
# heads, and math (the fallback, e.g. float32 with grouped heads) takes anything.
SHAPE_FREE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_for(device: torch.device) -> Callable[..., torch.Tensor]:
    """The attention a group runs on `device`: CUDA's without cuDNN, else SDPA as it chooses."""
    return attention_without_cudnn if device.type == "cuda" else grouped_query_attention


def attention_without_cudnn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """`grouped_query_attention` restricted to `SHAPE_FREE_BACKENDS`: the CUDA path.

    With a mask, each K/V head is repeated for the query heads it serves, so the masked call
    can take the memory-efficient kernel (which has no grouped-query form) instead of math.
    The same arithmetic as `grouped_query_attention` on any device, which the tests check on
    the CPU.
    """
    if mask is not None and k.shape[2] != q.shape[2]:
        group = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    with sdpa_kernel(SHAPE_FREE_BACKENDS):
        return grouped_query_attention(q, k, v, mask=mask, is_causal=is_causal)


def block_table_tensor(rows: list[PagedRow], block_size: int, device: torch.device) -> torch.Tensor:
    """The rows' block tables as one `[B, max_blocks]` tensor, each cut to what its row uses.

    Short tables are padded with block 0; those entries are only read at masked positions.
    """
    tables = []
    for row in rows:
        if not row.token_ids:
            raise ValueError("every row needs at least one new token")
        needed = blocks_for_length(row.start_position + len(row.token_ids), block_size)
        if needed > len(row.block_ids):
            raise ValueError(
                f"row needs {needed} blocks for {row.start_position} cached + "
                f"{len(row.token_ids)} new positions, its table has {len(row.block_ids)}"
            )
        tables.append(row.block_ids[:needed])
    width = max(len(table) for table in tables)
    padded = [table + [0] * (width - len(table)) for table in tables]
    return torch.tensor(padded, dtype=torch.long, device=device)


def flat_indices(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat index of each position `[B, N]`: its block from the row's table, plus the offset."""
    return table.gather(1, positions // block_size) * block_size + positions % block_size

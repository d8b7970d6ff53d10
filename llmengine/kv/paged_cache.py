"""The paged KV cache: K/V live in fixed-size blocks, found through each row's block table.

Storage per layer is `[num_blocks, block_size, kv_heads, head_dim]`, seen flat as
`num_blocks * block_size` entries, each found by its flat index `block_id * block_size +
offset`. A sequence owns any blocks, in any order; position p lives at flat index
`block_ids[p // block_size] * block_size + p % block_size`.

One forward serves rows of different lengths (prefills and decodes together): the new tokens
of every row are packed into one sequence, so the projections and the MLP compute exactly the
real positions and no pad. Attention runs once per group of rows with the same number of new
positions, each group as a `[rows, new]` query batch: all rows when every row computes the same
number (the packed sequence is then that batch, read without a copy), else the decode rows
together and every prefill row alone, so no decode query is padded to a prefill's length. A
group reads its rows' K/V position by position through flat indices, as `[rows, longest end]`
keys (reading whole blocks instead is slower: it copies the unused tail of every last block
too); a mask hides the keys past each query's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.contiguous_cache import zeroed_kv
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama, causal_mask, grouped_query_attention
from llmengine.speed.compiled import CompiledLayers


@dataclass(slots=True)
class PagedRow:
    """One sequence's share of a forward."""

    token_ids: list[int]  # tokens of the positions computed now
    start_position: int  # position of token_ids[0]; K/V of earlier positions is already cached
    block_ids: list[int]  # the block table, covering start_position + len(token_ids) positions


class PagedKVCache:
    """Per layer K/V storage `[num_blocks, block_size, kv_heads, head_dim]`, zero-filled.

    `swap_blocks` host blocks of the same shape (on the CPU, in pinned memory when the cache
    lives on CUDA, so copies to and from it can use DMA) hold the K/V of swapped-out requests;
    `swap_out` and `swap_in` move whole blocks between the two, by block id.
    """

    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        swap_blocks: int = 0,
    ) -> None:
        self.keys, self.values = zeroed_kv(config, (num_blocks, block_size), dtype, device)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host_keys, self.host_values = zeroed_kv(
            config, (swap_blocks, block_size), dtype, "cpu", pin_memory=self.device.type == "cuda"
        )
        self.swap_blocks = swap_blocks

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    def like(self, config: LlamaConfig) -> PagedKVCache:
        """An empty cache over the same pool (blocks, block size, dtype, device, swap space)
        for another model's layers and heads: a draft model's, on the same block tables."""
        return PagedKVCache(
            config, self.num_blocks, self.block_size, self.keys[0].dtype, self.device,
            self.swap_blocks,
        )  # fmt: skip

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block holds across every layer, keys and values: what a swap moves."""
        per_layer = self.keys[0][0].numel() * self.keys[0].element_size()
        return 2 * len(self.keys) * per_layer

    def swap(
        self, blocks_to_swap_out: list[tuple[int, int]], blocks_to_swap_in: list[tuple[int, int]]
    ) -> None:
        """Carry out one decision's swaps: every copy out, then every copy in. In that order
        because a device block a victim gave up may already be a swapped-in request's."""
        self.swap_out(blocks_to_swap_out)
        self.swap_in(blocks_to_swap_in)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks, `(device id, host id)` pairs: one copy per tensor."""
        if not pairs:
            return
        source = torch.tensor([device_id for device_id, _ in pairs], device=self.device)
        target = torch.tensor([host_id for _, host_id in pairs])
        for stored, host in ((self.keys, self.host_keys), (self.values, self.host_values)):
            for layer, host_layer in zip(stored, host, strict=True):
                host_layer.index_copy_(0, target, layer.index_select(0, source).cpu())

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks to device blocks, `(host id, device id)` pairs: one copy per tensor."""
        if not pairs:
            return
        source = torch.tensor([host_id for host_id, _ in pairs])
        target = torch.tensor([device_id for _, device_id in pairs], device=self.device)
        for stored, host in ((self.keys, self.host_keys), (self.values, self.host_values)):
            for layer, host_layer in zip(stored, host, strict=True):
                layer.index_copy_(0, target, host_layer.index_select(0, source).to(self.device))

    def write(
        self, layer_index: int, flat_indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store `k`, `v` `[N, kv_heads, head_dim]` at flat indices `[N]` (none twice)."""
        self.keys[layer_index].flatten(0, 1).index_copy_(0, flat_indices, k)
        self.values[layer_index].flatten(0, 1).index_copy_(0, flat_indices, v)

    def gather(
        self, layer_index: int, flat_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at flat indices of any shape `[...]`, as `[..., kv_heads, head_dim]`."""
        flat = flat_indices.flatten()
        shape = (*flat_indices.shape, *self.keys[layer_index].shape[2:])
        keys = self.keys[layer_index].flatten(0, 1).index_select(0, flat).view(shape)
        values = self.values[layer_index].flatten(0, 1).index_select(0, flat).view(shape)
        return keys, values


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
        out = grouped_query_attention(q, keys, values, mask=self.mask, is_causal=self.is_causal)
        return out.flatten(0, 1)


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


def paged_forward(
    model: Llama,
    cache: PagedKVCache,
    rows: list[PagedRow],
    compiled: CompiledLayers | None = None,
    logits_at: list[int] | None = None,
) -> torch.Tensor:
    """One forward over rows of any lengths; logits `[len(rows), vocab]` at each last new position.

    `compiled` runs the layers' position-wise halves compiled (`llmengine.speed.compiled`); None
    runs the model eager.
    `logits_at` asks for logits at other new positions instead, by index into the rows' new
    tokens packed in order (row 0's, then row 1's, ...): `[len(logits_at), vocab]`.
    Computes every new token's position (no pad) and leaves its K/V in the cache, so the next
    call for a row starts at `start_position + len(token_ids)`.
    """
    if not rows:
        raise ValueError("paged_forward needs at least one row")
    attention = GatheredAttention(cache, rows)
    input_ids = torch.tensor(
        [[token for row in rows for token in row.token_ids]], device=cache.device
    )
    if compiled is None:
        hidden = model.forward_hidden(input_ids, attention.positions, attention)
    else:
        hidden = compiled.forward_hidden(model, input_ids, attention.positions, attention)
    if logits_at is None:
        return model.compute_logits(hidden[0, attention.last_new])
    return model.compute_logits(hidden[0, torch.tensor(logits_at, device=cache.device)])

"""The paged KV cache: K/V live in fixed-size blocks, found through each row's block table.

Storage per layer is `[num_blocks, block_size, kv_heads, head_dim]`, seen flat as
`num_blocks * block_size` entries, each found by its flat index `block_id * block_size +
offset`. A sequence owns any blocks, in any order; position p lives at flat index
`block_ids[p // block_size] * block_size + p % block_size`. One forward serves rows
of different lengths (prefills and decodes together): the new tokens of every row are packed
into one sequence, so the projections and the MLP compute exactly the real positions and no
pad; only attention lays them out as a padded `[rows, longest]` batch, because each row reads
its own K/V, gathered through its block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmengine.blocks import blocks_for_length
from llmengine.config import LlamaConfig
from llmengine.model import LayerSteps, Llama, causal_mask, grouped_query_attention


@dataclass(slots=True)
class PagedRow:
    """One sequence's share of a forward."""

    token_ids: list[int]  # tokens of the positions computed now
    start_position: int  # position of token_ids[0]; K/V of earlier positions is already cached
    block_ids: list[int]  # the block table, covering start_position + len(token_ids) positions


class PagedKVCache:
    """Per layer K/V storage `[num_blocks, block_size, kv_heads, head_dim]`, zero-filled.

    Zeros, not `torch.empty`: a masked-out entry still enters attention as `0 * value`, and
    uninitialised memory could hold NaN, which survives that multiplication.

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
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.keys = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.num_blocks = num_blocks
        self.block_size = block_size
        host_shape = (swap_blocks, *shape[1:])
        pin = self.device.type == "cuda"
        self.host_keys = [torch.zeros(host_shape, dtype=dtype, pin_memory=pin) for _ in self.keys]
        self.host_values = [torch.zeros(host_shape, dtype=dtype, pin_memory=pin) for _ in self.keys]
        self.swap_blocks = swap_blocks

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block holds across every layer, keys and values: what a swap moves."""
        per_layer = self.keys[0][0].numel() * self.keys[0].element_size()
        return 2 * len(self.keys) * per_layer

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


class PagedAttention:
    """The `AttentionHook` of one paged forward; its index tensors are built once for all layers.

    The model sees the new tokens packed as one sequence `[1, N]`. Inside attention they are
    spread into a padded `[B, S]` batch (`is_new` marks the real entries) so each row can
    attend over its own gathered keys. A pad query is given its row's last real position, so
    it sees only real keys (no NaN from an all-masked row); its output is dropped on packing.
    """

    def __init__(self, cache: PagedKVCache, rows: list[PagedRow]) -> None:
        device, block_size = cache.device, cache.block_size
        new_lengths = torch.tensor([len(row.token_ids) for row in rows], device=device)
        starts = torch.tensor([row.start_position for row in rows], device=device)
        ends = starts + new_lengths
        offsets = torch.arange(int(new_lengths.max()), device=device)
        table = block_table_tensor(rows, block_size, device)

        self.cache = cache
        self.is_new = offsets < new_lengths[:, None]
        # Where each packed token sits in the flattened padded batch; None when every row
        # computes the same number of positions, since then the packed order is the batch.
        self.padded_index = None
        if not bool(self.is_new.all()):
            self.padded_index = self.is_new.flatten().nonzero().squeeze(1)
        padded_positions = torch.minimum(starts[:, None] + offsets, ends[:, None] - 1)
        self.positions = padded_positions[self.is_new][None]
        self.write_indices = flat_indices(table, padded_positions, block_size)[self.is_new]
        key_positions = torch.arange(int(ends.max()), device=device).expand(len(rows), -1)
        self.read_indices = flat_indices(table, key_positions, block_size)
        self.mask = causal_mask(padded_positions, int(ends.max()))
        self.last_new = torch.cumsum(new_lengths, dim=0) - 1

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.cache.write(layer_index, self.write_indices, k[0], v[0])
        keys, values = self.cache.gather(layer_index, self.read_indices)
        shape = (*self.is_new.shape, *q.shape[2:])
        if self.padded_index is None:
            out = grouped_query_attention(q.view(shape), keys, values, mask=self.mask)
            return out.reshape(q.shape)
        padded_q = q.new_zeros((self.is_new.numel(), *q.shape[2:]))
        padded_q.index_copy_(0, self.padded_index, q[0])
        out = grouped_query_attention(padded_q.view(shape), keys, values, mask=self.mask)
        return out.flatten(0, 1).index_select(0, self.padded_index)[None]


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
    model: Llama, cache: PagedKVCache, rows: list[PagedRow], steps: LayerSteps | None = None
) -> torch.Tensor:
    """One forward over rows of any lengths; logits `[len(rows), vocab]` at each last new position.

    `steps` replaces the layers' position-wise halves (compiled ones, say); None runs eager.
    Computes `positions_computed(rows)` positions (pad excluded) and leaves their K/V in the
    cache, so the next call for a row starts at `start_position + len(token_ids)`.
    """
    if not rows:
        raise ValueError("paged_forward needs at least one row")
    attention = PagedAttention(cache, rows)
    input_ids = torch.tensor(
        [[token for row in rows for token in row.token_ids]], device=cache.device
    )
    hidden = model.forward_hidden(input_ids, attention.positions, attention, steps)
    return model.compute_logits(hidden[0, attention.last_new])


def positions_computed(rows: list[PagedRow]) -> int:
    """Positions a `paged_forward` over `rows` computes: the new tokens, pad excluded."""
    return sum(len(row.token_ids) for row in rows)

"""The paged KV cache: K/V live in fixed-size blocks, found through each row's block table.

Storage per layer is `[num_blocks, block_size, kv_heads, head_dim]`, seen flat as
`num_blocks * block_size` entries, each found by its flat index `block_id * block_size +
offset`. A sequence owns any blocks, in any order; position p lives at flat index
`block_ids[p // block_size] * block_size + p % block_size`.

This module is the storage alone: write, gather, swap. What reads it during a forward (the
attention hooks) lives with the model runner (`llmengine.runner.attention`).
"""

from __future__ import annotations

import torch

from llmengine.kv.contiguous_cache import zeroed_kv
from llmengine.model.config import LlamaConfig


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

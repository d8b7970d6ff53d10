"""What a KV cache holds versus what it reserves: bytes per position and the paged tail waste.

A paged sequence fills its blocks in order, so only its last block can be partly empty: at
most `block_size - 1` empty positions per sequence, whatever its length. `measure_tail_waste`
checks that by growing real block tables one token at a time through a real `BlockPool`,
the way the incremental scheduler grows them during decode, and counting what is left over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmengine.kv.blocks import BlockPool, BlockTable, blocks_for_length
from llmengine.model.config import LlamaConfig

TABLE_ENTRY_BYTES = 4  # one int32 block id per table entry, as serving engines store them


def kv_bytes_per_position(config: LlamaConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one cached position costs: a key and a value per layer, per KV head."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


@dataclass(frozen=True, slots=True)
class TailWaste:
    """The blocks a set of sequences holds and the positions left empty in their last blocks."""

    block_size: int
    num_sequences: int
    tokens: int
    blocks: int
    empty_positions: int
    max_tail: int  # the most empty positions any one sequence had

    @property
    def reserved_positions(self) -> int:
        """Positions reserved: every position of every block held, full or not."""
        return self.blocks * self.block_size

    @property
    def waste_fraction(self) -> float:
        """Share of the reserved positions that hold no token."""
        reserved = self.reserved_positions
        return self.empty_positions / reserved if reserved else 0.0

    @property
    def bound(self) -> int:
        """The most the tails can waste: `block_size - 1` positions per sequence."""
        return (self.block_size - 1) * self.num_sequences


def measure_tail_waste(lengths: Sequence[int], block_size: int) -> TailWaste:
    """Grow one block table per sequence to its length, token by token, and count the waste.

    A block is taken from the pool only when the next token finds the table full, as the
    incremental scheduler does; nothing is freed, so the pool ends holding every table.
    """
    if not lengths or min(lengths) < 1:
        raise ValueError(f"need at least one sequence, each of length >= 1, got {lengths}")
    pool = BlockPool(sum(blocks_for_length(length, block_size) for length in lengths))
    tables = []
    for length in lengths:
        table = BlockTable(block_size)
        for _ in range(length):
            if table.num_tokens == table.capacity:
                table.extend(pool.allocate(1))
            table.append()
        tables.append(table)
    tails = [table.capacity - table.num_tokens for table in tables]
    return TailWaste(
        block_size=block_size,
        num_sequences=len(tables),
        tokens=sum(table.num_tokens for table in tables),
        blocks=pool.num_held,
        empty_positions=sum(tails),
        max_tail=max(tails),
    )

"""The CPU decode graph's inputs, written in place into host arrays that live with the graph.

Every decode step hands the compiled graph (`llmengine.runner.graphs`) its rows' token ids,
positions and write slots, and the tensors its block mask is made of (`paged_block_mask`).
Built with torch operators, as tensors made afresh, that was some twenty small operators a
step, 0.2 ms on a 2-core EPYC: a tenth of a one-stream step of the embedded model, spent
before the forward starts. Here each bucket owns numpy arrays allocated once, and tensors
over the same memory (`torch.from_numpy`) that the graph takes as inputs; a step writes the
rows' numbers into the arrays with numpy, and makes no tensor. The graph sees the same input
tensors every step, which is what the CUDA graph's `StepBuffers` does on a GPU.

`block_mask_tensors` computes the same block-mask tensors from torch tensors, for callers
that hold their rows as tensors (the paged-attention benchmark, the tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from llmengine.runner.attention import PagedRow
from llmengine.runner.step_buffers import check_decode_row

# A decode graph's inputs: token ids, positions, write slots and the block mask's tensors.
DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]


class DecodeInputBuffers:
    """One bucket's decode inputs for a pool of `num_blocks` blocks (the scratch block
    included): `fill(rows)` writes them in place and returns the same tensors every time.

    Block tables are `num_blocks` wide whatever the rows' lengths, so every shape depends on
    the bucket alone; entries past a row's blocks keep what an earlier step wrote (valid
    block ids, never visited: the block lists name only a row's own blocks). Padding rows
    stand at position 0 of `scratch_block`: they write and read its first slot, which no
    request owns.
    """

    def __init__(self, bucket: int, num_blocks: int, block_size: int, scratch_block: int) -> None:
        self.bucket, self.num_blocks = bucket, num_blocks
        self.block_size, self.scratch_block = block_size, scratch_block
        self._padding_row = PagedRow([0], 0, [scratch_block])
        self._places = np.arange(num_blocks)
        self.token_ids = np.zeros(bucket, np.int64)
        self.positions = np.zeros(bucket, np.int64)
        self.write_slots = np.zeros(bucket, np.int64)
        # The block mask's tensors, in `paged_flex.paged_block_mask`'s order.
        self.partial_blocks = np.zeros(bucket, np.int32)
        self.partial_tables = np.zeros((bucket, num_blocks), np.int32)
        self.full_blocks = np.zeros(bucket, np.int32)
        self.block_tables = np.full((bucket, num_blocks), scratch_block, np.int32)
        self.ends = np.zeros(bucket, np.int64)
        self.table_places = np.zeros((bucket, num_blocks), np.int64)
        mask = (
            self.partial_blocks,
            self.partial_tables,
            self.full_blocks,
            self.block_tables,
            self.ends,
            self.table_places,
        )
        self.inputs: DecodeInputs = (
            torch.from_numpy(self.token_ids),
            torch.from_numpy(self.positions),
            torch.from_numpy(self.write_slots),
            tuple(torch.from_numpy(array) for array in mask),
        )

    def fill(self, rows: Sequence[PagedRow]) -> DecodeInputs:
        """Write decode `rows` (one new token each) padded to the bucket, and return the
        inputs. ValueError, before anything is written, for more rows than the bucket, or a
        row that is not one decode token whose table covers its position.

        A row's scalars are worked out in Python and written an array at a time, and its
        blocks with two numpy calls: a step costs a dozen numpy calls, not one per number."""
        if len(rows) > self.bucket:
            raise ValueError(f"{len(rows)} rows do not fit bucket {self.bucket}")
        for row in rows:
            check_decode_row(row, self.block_size, self.num_blocks)
        block_size = self.block_size
        # Each row reads its `end // block_size` full blocks whole and a partly filled last
        # one up to its end; `table_places` gives each pool block's place in the row's
        # table (-1: not the row's), for the mask function.
        self.table_places[:] = -1
        numbers = []
        for index, row in enumerate([*rows, *[self._padding_row] * (self.bucket - len(rows))]):
            position = row.start_position
            full, filled = divmod(position + 1, block_size)
            blocks = row.block_ids[: position // block_size + 1]
            self.block_tables[index, : len(blocks)] = blocks
            self.table_places[index, blocks] = self._places[: len(blocks)]
            write_slot = blocks[-1] * block_size + position % block_size
            last = blocks[full] if filled else 0  # the partly filled block, if there is one
            numbers.append((row.token_ids[0], position, write_slot, position + 1, full, last))
        tokens, positions, write_slots, ends, full_blocks, lasts = zip(*numbers, strict=True)
        self.token_ids[:] = tokens
        self.positions[:] = positions
        self.write_slots[:] = write_slots
        self.ends[:] = ends
        self.full_blocks[:] = full_blocks
        np.greater(self.ends % block_size, 0, out=self.partial_blocks, casting="unsafe")
        self.partial_tables[:, 0] = lasts
        return self.inputs


def block_mask_tensors(
    ends: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, ...]:
    """What `paged_block_mask` builds its mask from, for rows whose queries see positions
    `0 .. ends[b] - 1` through `block_tables` `[B, width]` (the cache's block count):
    `DecodeInputBuffers`' arithmetic on rows held as tensors."""
    rows, width = block_tables.shape
    buffers = DecodeInputBuffers(rows, width, block_size, scratch_block=0)
    tables = block_tables.tolist()
    buffers.fill([PagedRow([0], end - 1, tables[row]) for row, end in enumerate(ends.tolist())])
    return tuple(tensor.clone() for tensor in buffers.inputs[3])

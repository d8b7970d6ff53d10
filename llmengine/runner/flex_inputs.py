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
    the bucket alone. Padding rows stand at position 0 of `scratch_block`: they write and
    read its first slot, which no request owns.
    """

    def __init__(self, bucket: int, num_blocks: int, block_size: int, scratch_block: int) -> None:
        self.bucket, self.num_blocks = bucket, num_blocks
        self.block_size, self.scratch_block = block_size, scratch_block
        self._rows = np.arange(bucket)
        self._columns = np.arange(num_blocks)
        self.token_ids = np.zeros(bucket, np.int64)
        self.positions = np.zeros(bucket, np.int64)
        self.write_slots = np.zeros(bucket, np.int64)
        self.tables = np.zeros((bucket, num_blocks), np.int64)
        # The block mask's tensors, in `paged_flex.paged_block_mask`'s order.
        self.partial_blocks = np.zeros(bucket, np.int32)
        self.partial_tables = np.zeros((bucket, num_blocks), np.int32)
        self.full_blocks = np.zeros(bucket, np.int32)
        self.block_tables = np.zeros((bucket, num_blocks), np.int32)
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
        row that is not one decode token whose table covers its position."""
        if len(rows) > self.bucket:
            raise ValueError(f"{len(rows)} rows do not fit bucket {self.bucket}")
        for row in rows:
            check_decode_row(row, self.block_size, self.num_blocks)
        block_size, tables = self.block_size, self.tables
        tables[:] = 0  # entries past a row's blocks are only read at masked positions
        for index, row in enumerate(rows):
            position = row.start_position
            used = position // block_size + 1
            tables[index, :used] = row.block_ids[:used]
            self.token_ids[index] = row.token_ids[0]
            self.positions[index] = position
        padding = len(rows)
        self.token_ids[padding:] = 0
        self.positions[padding:] = 0
        tables[padding:] = self.scratch_block
        positions = self.positions
        self.write_slots[:] = tables[self._rows, positions // block_size] * block_size
        self.write_slots += positions % block_size
        np.add(positions, 1, out=self.ends)
        self._fill_mask()
        return self.inputs

    def _fill_mask(self) -> None:
        """The block mask's tensors from `tables` and `ends`: each row reads its
        `ends // block_size` full blocks whole and a partly filled last one up to its end;
        `table_places` gives each pool block's place in the row's table (-1: not the
        row's), for the mask function."""
        block_size, width, tables = self.block_size, self.num_blocks, self.tables
        np.floor_divide(self.ends, block_size, out=self.full_blocks, casting="unsafe")
        np.greater(self.ends % block_size, 0, out=self.partial_blocks, casting="unsafe")
        last = tables[self._rows, np.minimum(self.full_blocks, width - 1)]
        self.partial_tables[:] = 0
        self.partial_tables[:, 0] = last
        self.block_tables[:] = tables
        used = self._columns < (self.full_blocks + self.partial_blocks)[:, None]
        row_of, place = np.nonzero(used)
        self.table_places[:] = -1
        self.table_places[row_of, tables[row_of, place]] = place


def block_mask_tensors(
    ends: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, ...]:
    """What `paged_block_mask` builds its mask from, for rows whose queries see positions
    `0 .. ends[b] - 1` through CPU `block_tables` `[B, width]` (the cache's block count):
    `DecodeInputBuffers`' arithmetic on rows held as tensors."""
    rows, width = block_tables.shape
    buffers = DecodeInputBuffers(rows, width, block_size, scratch_block=0)
    buffers.tables[:] = block_tables.numpy()
    buffers.ends[:] = ends.numpy()
    buffers._fill_mask()
    return tuple(tensor.clone() for tensor in buffers.inputs[3])

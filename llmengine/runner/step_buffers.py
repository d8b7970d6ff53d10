"""A decode step's inputs that live on the device, allocated once and changed in place.

A captured CUDA graph reads its inputs from fixed addresses, so one bucket's inputs are one
device tensor `[4 + width, bucket]` of int64 (the rows' token ids, positions, write slots and
sequence lengths, each a contiguous row of it, then their block tables, `width` blocks deep,
one column per row), allocated once. Each step
fills a host staging tensor of the same shape (pinned on CUDA, so its copy needs no sync)
with the rows' numbers and copies it over in one `copy_`: no device tensor is made per step.

Only what a row uses is written: its first blocks of the table; entries past them stay as
an earlier step left them, valid block ids, read only at masked positions. Padding rows
stand at position 0 of the scratch block, which no request owns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmengine.kv.blocks import blocks_for_length
from llmengine.runner.attention import PagedRow

TOKEN, POSITION, WRITE_SLOT, LENGTH, TABLE = 0, 1, 2, 3, 4  # rows of the packed buffer


class StepBuffers:
    """One bucket's persistent decode inputs: `token_ids`, `positions`, `write_slots`,
    `lengths` (`[bucket]` each, contiguous) and `block_tables` (`[bucket, width]`), views of
    one device tensor that `fill` and `upload` change in place."""

    def __init__(
        self,
        bucket: int,
        width: int,
        block_size: int,
        scratch_block: int,
        device: torch.device,
    ) -> None:
        self.bucket, self.width = bucket, width
        self.block_size, self.scratch_block = block_size, scratch_block
        shape = (TABLE + width, bucket)
        # Pinned host memory lets the copy to the device run asynchronously, without a sync.
        pinned = device.type == "cuda"
        self.staging = torch.zeros(shape, dtype=torch.long, pin_memory=pinned)
        self._host = self.staging.numpy()
        self._host[TABLE:] = scratch_block
        self.device_tensor = torch.zeros(shape, dtype=torch.long, device=device)
        self.token_ids = self.device_tensor[TOKEN]
        self.positions = self.device_tensor[POSITION]
        self.write_slots = self.device_tensor[WRITE_SLOT]
        self.lengths = self.device_tensor[LENGTH]
        self.block_tables = self.device_tensor[TABLE:].t()
        self.fill([])
        self.upload()

    def fill(self, rows: Sequence[PagedRow]) -> None:
        """Write decode `rows` (one new token each) into the host staging, padded to the
        bucket. ValueError, before anything is written, for a row that is not one decode
        token or whose table does not cover its position or exceeds the buffers' width."""
        if len(rows) > self.bucket:
            raise ValueError(f"{len(rows)} rows do not fit bucket {self.bucket}")
        for row in rows:
            check_decode_row(row, self.block_size, self.width)
        host, block_size = self._host, self.block_size
        for index, row in enumerate(rows):
            position = row.start_position
            used = blocks_for_length(position + 1, block_size)
            host[TABLE : TABLE + used, index] = row.block_ids[:used]
            host[TOKEN, index] = row.token_ids[0]
            host[POSITION, index] = position
            host[WRITE_SLOT, index] = row.block_ids[position // block_size] * block_size + (
                position % block_size
            )
            host[LENGTH, index] = position + 1
        padding = host[:, len(rows) :]
        padding[TOKEN] = 0
        padding[POSITION] = 0
        padding[WRITE_SLOT] = self.scratch_block * block_size
        padding[LENGTH] = 1
        padding[TABLE] = self.scratch_block

    def upload(self) -> None:
        """Copy the staging to the device buffers, in place. On CUDA the copy is queued on
        the current stream without waiting; the staging is not written again before the
        step's read-back of its sampled ids, which waits for the stream, copy included."""
        self.device_tensor.copy_(self.staging, non_blocking=True)


def check_decode_row(row: PagedRow, block_size: int, width: int) -> None:
    """ValueError unless `row` computes one token whose position its block table covers,
    within `width` blocks."""
    if len(row.token_ids) != 1:
        raise ValueError(f"a decode row computes one token, this one {len(row.token_ids)}")
    needed = blocks_for_length(row.start_position + 1, block_size)
    if needed > len(row.block_ids):
        raise ValueError(
            f"row needs {needed} blocks for position {row.start_position}, "
            f"its table has {len(row.block_ids)}"
        )
    if needed > width:
        raise ValueError(f"row needs {needed} blocks, the decode graph reads at most {width}")

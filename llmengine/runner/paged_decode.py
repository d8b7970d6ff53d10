"""Decode attention that reads K/V where it lives in the paged cache: one Triton kernel.

The static decode step (`llmengine.runner.static_decode`) must keep every shape fixed for a
CUDA graph. Gathering each row's keys through its block table does that, but the gather is
as wide as the table (`StepBuffers.width`: by default the whole pool), whatever the row's
length: for the issue's 1B model at 256 rows of 192 tokens the pool is 3,072 blocks, so a
step would copy 49,152 keys per row per layer, hundreds of gigabytes a step, where the
rows' own K/V are under a gigabyte. This kernel's shapes are fixed too (a program per row
and K/V head), but each program loops over its row's own blocks only, reading the length and
the block ids from the step's buffers on the device: the loop's length changes without a
new launch shape, so a captured graph replays it at every length, and nothing is gathered.

Each program holds the query heads that share its K/V head (grouped-query attention: query
head h reads K/V head h // group) and keeps an online softmax (running maximum, sum and
weighted values, in float32) over the row's blocks, one cache block at a time. The products
are broadcasts and sums rather than `tl.dot`, whose tiles want 16 rows and a group has 4:
decode attention is bound by reading K/V, not by arithmetic.

On CPU tensors the same kernel runs in Triton's interpreter (numpy, slow; `interpreted()`):
what the CPU tests check its numbers with. `available()` says whether Triton is installed.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton: the step gathers instead
    triton = None


def available() -> bool:
    """Whether Triton is installed, so that `paged_decode_attention` can run."""
    return triton is not None


def _paged_decode_kernel(  # Triton reads the annotations: only the constants carry one
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    lengths_ptr,
    q_row,
    q_head,
    kv_slot,
    kv_head,
    out_row,
    out_head,
    table_row,
    table_column,
    scale,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
) -> None:
    row = tl.program_id(0)
    kv = tl.program_id(1)
    group = tl.arange(0, GROUP_PAD)
    heads = kv * GROUP + group
    dims = tl.arange(0, DIM_PAD)
    real_dims = (dims < HEAD_DIM)[None, :]
    head_dims = (group < GROUP)[:, None] & real_dims
    q_places = row * q_row + heads[:, None] * q_head + dims[None, :]
    q = tl.load(q_ptr + q_places, mask=head_dims, other=0.0).to(tl.float32)
    length = tl.load(lengths_ptr + row)
    highest = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    weighted = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    offsets = tl.arange(0, BLOCK_SIZE)
    # A while loop, not a `range` up to a loaded bound: Triton's interpreter (the CPU tests')
    # makes that bound a Python int, which numpy 2 refuses for a one-element array.
    index = 0
    while index * BLOCK_SIZE < length:
        block = tl.load(tables_ptr + row * table_row + index * table_column)
        visible = index * BLOCK_SIZE + offsets < length
        places = (block * BLOCK_SIZE + offsets)[:, None] * kv_slot + kv * kv_head + dims[None, :]
        token_dims = visible[:, None] & real_dims
        k = tl.load(k_ptr + places, mask=token_dims, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + places, mask=token_dims, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(visible[None, :], scores, float("-inf"))
        # A block's first position is always visible (the loop stops at the length), so the
        # new maximum is finite and the first block's rescale is exp(-inf) = 0.
        new_highest = tl.maximum(highest, tl.max(scores, axis=1))
        rescale = tl.exp(highest - new_highest)
        weights = tl.exp(scores - new_highest[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        weighted = weighted * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
        highest = new_highest
        index += 1
    out = weighted / total[:, None]
    out_places = row * out_row + heads[:, None] * out_head + dims[None, :]
    tl.store(out_ptr + out_places, out.to(out_ptr.dtype.element_ty), mask=head_dims)


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter, on CPU tensors: set by
    `TRITON_INTERPRET=1` before Triton is first imported, as the CPU tests run it."""
    return triton is not None and bool(triton.knobs.runtime.interpret)


if triton is not None:
    _paged_decode = triton.jit(_paged_decode_kernel)


def paged_decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Attention `[B, 1, heads, head_dim]` of one query per row (`q`, same shape) over the
    first `lengths[b]` positions of row b, read from the flat paged cache `keys`/`values`
    `[slots, kv_heads, head_dim]` through `block_tables` `[B, width]` (slot = block *
    `block_size` + offset). The scale is SDPA's, 1/sqrt(head_dim). Every row's length must be
    at least 1 and its table must cover it."""
    if triton is None:
        raise RuntimeError("paged decode attention needs Triton, which is not installed")
    if q.device.type == "cpu" and not interpreted():
        raise ValueError("on CPU tensors the kernel runs only in Triton's interpreter")
    rows, queries, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    if queries != 1 or heads % kv_heads or q.stride(3) != 1 or keys.stride(2) != 1:
        raise ValueError("paged decode attention takes one query per row, dims contiguous")
    out = torch.empty(rows, heads, head_dim, dtype=q.dtype, device=q.device)
    group = heads // kv_heads
    _paged_decode[(rows, kv_heads)](
        q,
        keys,
        values,
        out,
        block_tables,
        lengths,
        q.stride(0),
        q.stride(2),
        keys.stride(0),
        keys.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        block_tables.stride(1),
        1.0 / math.sqrt(head_dim),
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
    )
    return out.view(rows, 1, heads, head_dim)

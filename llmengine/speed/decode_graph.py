"""The decode step as one compiled graph per batch bucket (the CPU analogue of CUDA graphs).

A decode step is a fixed chain of operators whose shapes depend only on the batch size and
on how many cached keys the rows read. Eager, every operator pays dispatch, and the matrix
products of a few rows run through MKL's slow matrix-vector path; compiled whole by inductor
with the weights frozen into the graph, the products become inductor's own GEMM template
(max-autotune picks it where it wins), which reads the weights near memory bandwidth.

The batch is padded up to a bucket (1, 2, 4, 8, ...), so one graph serves several batch
sizes; padding rows write their K/V into a scratch slot that no request reads (the engine
gives the cache one block beyond the pool) and their logits are dropped. The K/V cache
tensors are inputs, mutated in place, never frozen: the same tensors the eager forward and
swaps use.

Attention reads K/V where it lives: the whole pool is one long key sequence to
`flex_attention`, and a block mask built from each row's block table names the blocks that
row may read (its full blocks, then its partly filled last one), so the kernel visits those
blocks in place instead of copying every key into a `[rows, keys]` tensor first, as the eager
forward does (measured in reports/wallclock/paged-attention.md). Every input's shape depends
on the bucket alone, whatever the context length: one graph per bucket.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from llmengine.kv.paged_cache import PagedKVCache, PagedRow, block_table_tensor, paged_forward
from llmengine.model.llama import Llama
from llmengine.model.rope import apply_rotary
from llmengine.speed.prepare import PreparedLlama, fused_weights

BUCKETS = (1, 2, 4, 8, 16, 32)
# Inductor settings, chosen by measurement (reports/wallclock/decode-graph.md): frozen weights
# let max-autotune's GEMM template replace MKL for the few-row products.
CPU_OPTIONS: dict[str, object] = {"freezing": True, "max_autotune": True}
# Keep every bucket's graph even where eager measured faster (tests that count graph use).
KEEP_SLOWER_GRAPHS = False


def buckets_for(num_slots: int, buckets: Sequence[int] = BUCKETS) -> list[int]:
    """The buckets an engine of `num_slots` slots needs: those below it and the first >= it."""
    chosen = [bucket for bucket in buckets if bucket < num_slots]
    return chosen + [next((b for b in buckets if b >= num_slots), num_slots)]


class DecodeForward(nn.Module):
    """One decode step of `model` as a pure tensor function (what gets compiled).

    The weight of every product (`fused_weights`) is registered here as a parameter, so that
    inductor's freezing folds it as a constant (a prepared product's fused weight is a plain
    tensor attribute, which it would not).
    """

    def __init__(self, model: Llama) -> None:
        super().__init__()
        if isinstance(model, PreparedLlama) and model.quantization == "int8":
            # The graph multiplies by the float weights it folds in, not by int8 copies.
            raise ValueError("the decode graph does not take an int8-quantised model")
        self.model = model
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterDict()
        for index, (weight, bias) in enumerate(fused_weights(model)):
            self.weights.append(nn.Parameter(weight, requires_grad=False))
            if bias is not None:
                self.biases[str(index)] = nn.Parameter(bias, requires_grad=False)

    def _linear(self, index: int, x: torch.Tensor) -> torch.Tensor:
        bias = self.biases.get(str(index), None)
        return F.linear(x, self.weights[index], bias)

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_indices: torch.Tensor,
        mask_tensors: tuple[torch.Tensor, ...],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """Logits `[B, vocab]` for one new token per row; writes each row's K/V at its index.

        `keys`/`values` are the cache's per-layer tensors flattened to `[slots, kv_heads,
        head_dim]`; `mask_tensors` (`block_mask_tensors`) say which blocks each row reads.
        """
        model, config = self.model, self.model.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        x = model.embed_tokens(token_ids)[:, None]
        cos, sin = model.rotary(positions[:, None])
        block_mask = paged_block_mask(mask_tensors, keys[0].shape[0])
        for index, layer in enumerate(model.layers):
            qkv = self._linear(1 + 4 * index, layer.input_layernorm(x))
            qkv = qkv.view(qkv.shape[0], 1, heads + 2 * kv_heads, config.head_dim)
            rotated = apply_rotary(qkv[:, :, : heads + kv_heads], cos, sin)
            q, k = rotated.split([heads, kv_heads], dim=2)
            v = qkv[:, :, heads + kv_heads :]
            keys[index].index_copy_(0, write_indices, k[:, 0])
            values[index].index_copy_(0, write_indices, v[:, 0])
            attended = paged_decode_attention(q, keys[index], values[index], block_mask)
            x = x + self._linear(2 + 4 * index, attended.flatten(2))
            gate, up = self._linear(3 + 4 * index, layer.post_attention_layernorm(x)).chunk(2, -1)
            x = x + self._linear(4 + 4 * index, F.silu(gate) * up)
        return self._linear(0, model.norm(x)[:, 0])


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


def paged_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_mask: BlockMask
) -> torch.Tensor:
    """Attention `[B, 1, heads, head_dim]` of one query per row over the pool `[slots, kv_heads,
    head_dim]`, read in place through `block_mask` (one batch view of the pool per row)."""
    rows = q.shape[0]
    pool_keys = keys.transpose(0, 1)[None].expand(rows, -1, -1, -1)
    pool_values = values.transpose(0, 1)[None].expand(rows, -1, -1, -1)
    out = flex_attention(
        q.transpose(1, 2),
        pool_keys,
        pool_values,
        block_mask=block_mask,
        enable_gqa=q.shape[2] != keys.shape[1],
    )
    return out.transpose(1, 2)  # type: ignore[union-attr]


def decode_inputs(
    rows: Sequence[PagedRow],
    block_size: int,
    num_blocks: int,
    bucket: int,
    scratch_block: int,
    device: torch.device,
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], ...]:
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


class DecodeGraphs:
    """A compiled `DecodeForward` for each bucket that beat eager when it was built.

    `graph_for(n)` is the bucket (or None: run eager) for a decode of n rows. Built once,
    at engine start: each bucket is compiled (inductor's on-disk caches make a second start in
    a new process quicker) and timed against the eager forward on the same dummy decode; a
    bucket whose graph is not faster is dropped, so the graph never makes a step slower.

    The weights are folded into each graph as they are when it is built: weights changed
    later (a new state dict) are not seen by it. Each bucket's graph holds its own prepared
    (packed) copies of them, which costs memory per bucket.

    On CUDA the same buckets go through inductor's CUDA graphs (`triton.cudagraphs`), with
    the cache tensors marked as static addresses so that mutating them does not disable
    them. No test covers that path: `tests/test_cuda.py` builds no decode graph.
    """

    def __init__(
        self,
        model: Llama,
        cache: PagedKVCache,
        scratch_block: int,
        buckets: Sequence[int],
        options: dict[str, object] | None = None,
        keep_slower: bool = False,
    ) -> None:
        self.cache = cache
        self.scratch_block = scratch_block
        self.keys = [k.flatten(0, 1) for k in cache.keys]
        self.values = [v.flatten(0, 1) for v in cache.values]
        cuda = cache.device.type == "cuda"
        if options is None:
            options = {"triton.cudagraphs": True} if cuda else CPU_OPTIONS
        if cuda:
            for tensor in self.keys + self.values:
                torch._dynamo.mark_static_address(tensor)
        # Dynamo installs the parameters as constants of the graph only when it sees inductor's
        # `freezing` set while it traces; set in `options` alone, the weights stayed inputs of
        # extern `mm` calls and the graph was no faster than eager. One graph per bucket:
        # more than dynamo's default 8 recompiles.
        self._inductor_patch = torch._inductor.config.patch(freezing=bool(options.get("freezing")))
        self._dynamo_patch = torch._dynamo.config.patch(recompile_limit=64)
        self.compiled = torch.compile(
            DecodeForward(model), fullgraph=True, dynamic=False, options=options
        )
        self.compile_seconds: dict[int, float] = {}
        self.step_ms: dict[int, tuple[float, float]] = {}  # bucket: (eager, graph)
        self.buckets: list[int] = []
        for bucket in buckets:
            self._build(model, bucket, scratch_block, keep_slower)

    def _build(self, model: Llama, bucket: int, scratch_block: int, keep_slower: bool) -> None:
        context = 4 * self.cache.block_size  # a typical decode's keys, for the timing
        rows = [PagedRow([0], context - 1, [scratch_block] * 4) for _ in range(bucket)]
        with torch.inference_mode(), self._inductor_patch, self._dynamo_patch:
            start = time.perf_counter()
            self(rows)
            self.compile_seconds[bucket] = time.perf_counter() - start
            eager = graph = float("inf")
            for _ in range(3):  # interleaved: a neighbour's burst of load hits both alike
                eager = min(eager, best_ms(lambda: paged_forward(model, self.cache, rows), 3))
                graph = min(graph, best_ms(lambda: self(rows), 3))
        self.step_ms[bucket] = (eager, graph)
        # CUDA launches asynchronously, so these timings would not mean much there; its
        # graphs are kept (replaying a CUDA graph is what wins on a GPU).
        cuda = self.cache.device.type == "cuda"
        if graph < eager or keep_slower or KEEP_SLOWER_GRAPHS or cuda:
            self.buckets.append(bucket)

    def graph_for(self, num_rows: int) -> int | None:
        """The smallest kept bucket that holds `num_rows` decode rows, or None (run eager)."""
        return next((bucket for bucket in self.buckets if bucket >= num_rows), None)

    def __call__(self, rows: Sequence[PagedRow], bucket: int | None = None) -> torch.Tensor:
        """Logits `[len(rows), vocab]` of a decode step over `rows` (one new token each)."""
        bucket = len(rows) if bucket is None else bucket
        cache = self.cache
        inputs = decode_inputs(
            rows, cache.block_size, cache.num_blocks, bucket, self.scratch_block, cache.device
        )
        with self._inductor_patch, self._dynamo_patch:
            logits = self.compiled(*inputs, self.keys, self.values)
        return logits[: len(rows)]


def best_ms(step: Callable[[], object], repeats: int = 5) -> float:
    """Fastest of `repeats` calls, in milliseconds (the machine is shared: the minimum is the
    least disturbed)."""
    step()  # the first call warms caches and allocators; it is not timed
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best * 1e3

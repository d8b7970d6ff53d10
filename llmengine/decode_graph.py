"""The decode step as one compiled graph per batch bucket (the CPU analogue of CUDA graphs).

A decode step is a fixed chain of operators whose shapes depend only on the batch size and
on how many cached keys the rows read. Eager, every operator pays dispatch, and the matrix
products of a few rows run through MKL's slow matrix-vector path; compiled whole by inductor
with the weights frozen into the graph, the products become inductor's own GEMM template
(max-autotune picks it where it wins), which reads the weights near memory bandwidth.

The batch is padded up to a bucket (1, 2, 4, 8, ...), so one graph serves several batch
sizes; padding rows write their K/V into a scratch slot that no request reads (the engine
gives the cache one block beyond the pool) and their logits are dropped. The number of keys
`K` is symbolic (one graph per bucket, whatever the context length). The K/V cache tensors
are inputs, mutated in place, never frozen: the same tensors the eager forward and swaps use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from llmengine.model import Llama, grouped_query_attention
from llmengine.paged_cache import (
    PagedKVCache,
    PagedRow,
    block_table_tensor,
    flat_indices,
    paged_forward,
)
from llmengine.rope import apply_rotary

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

    The weight of every product group (`Llama.linear_groups`: head, then per layer QKV,
    output, gate-up, down) is registered here as a parameter, fused, so that inductor's
    freezing folds it as a constant (a `LinearGroup`'s fused weight is a plain tensor
    attribute, which it would not).
    """

    def __init__(self, model: Llama) -> None:
        super().__init__()
        if any(group.int8 is not None for group in model.linear_groups()):
            # The graph multiplies by the float weights it folds in, not by int8 copies.
            raise ValueError("the decode graph does not take an int8-quantised model")
        self.model = model
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterDict()
        for index, group in enumerate(model.linear_groups()):
            layers = group.layers
            weight = group.weight if group.is_fused else torch.cat([x.weight for x in layers])
            self.weights.append(nn.Parameter(weight, requires_grad=False))
            if getattr(layers[0], "bias", None) is not None:
                bias = group.bias if group.is_fused else torch.cat([x.bias for x in layers])  # type: ignore[attr-defined]
                self.biases[str(index)] = nn.Parameter(bias, requires_grad=False)

    def _linear(self, index: int, x: torch.Tensor) -> torch.Tensor:
        bias = self.biases.get(str(index), None)
        return F.linear(x, self.weights[index], bias)

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_indices: torch.Tensor,
        read_indices: torch.Tensor,
        key_mask: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """Logits `[B, vocab]` for one new token per row; writes each row's K/V at its index.

        `keys`/`values` are the cache's per-layer tensors flattened to `[slots, kv_heads,
        head_dim]`; `read_indices` `[B, K]` are the slots of each row's keys, `key_mask`
        `[B, K]` is True where the row may see the key.
        """
        model, config = self.model, self.model.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        x = model.embed_tokens(token_ids)[:, None]
        cos, sin = model.rotary(positions[:, None])
        mask = key_mask[:, None, None, :]
        for index, layer in enumerate(model.layers):
            qkv = self._linear(1 + 4 * index, layer.input_layernorm(x))
            qkv = qkv.view(qkv.shape[0], 1, heads + 2 * kv_heads, config.head_dim)
            rotated = apply_rotary(qkv[:, :, : heads + kv_heads], cos, sin)
            q, k = rotated.split([heads, kv_heads], dim=2)
            v = qkv[:, :, heads + kv_heads :]
            keys[index].index_copy_(0, write_indices, k[:, 0])
            values[index].index_copy_(0, write_indices, v[:, 0])
            cached_k, cached_v = keys[index][read_indices], values[index][read_indices]
            attended = grouped_query_attention(q, cached_k, cached_v, mask=mask)
            x = x + self._linear(2 + 4 * index, attended.flatten(2))
            gate, up = self._linear(3 + 4 * index, layer.post_attention_layernorm(x)).chunk(2, -1)
            x = x + self._linear(4 + 4 * index, F.silu(gate) * up)
        return self._linear(0, model.norm(x)[:, 0])


def decode_inputs(
    rows: Sequence[PagedRow],
    block_size: int,
    bucket: int,
    scratch_slot: int,
    device: torch.device,
    round_keys: bool = False,
) -> tuple[torch.Tensor, ...]:
    """The graph's index inputs for decode `rows` padded to `bucket` rows.

    Row i reads keys 0..K-1 (K the longest row's end) through its block table; the mask
    hides a shorter row's tail. Padding rows write and read `scratch_slot` alone.
    `round_keys` rounds K up to a power of two (the extra keys read the scratch slot,
    masked), so that a CUDA graph, whose shapes are fixed, is recorded for few K.
    """
    ends = torch.tensor([row.start_position + 1 for row in rows], device=device)
    num_keys = int(ends.max())
    key_positions = torch.arange(num_keys, device=device).expand(len(rows), -1)
    read = flat_indices(
        block_table_tensor(list(rows), block_size, device), key_positions, block_size
    )
    mask = key_positions < ends[:, None]
    write = read.gather(1, (ends - 1)[:, None])[:, 0]
    token_ids = torch.tensor([row.token_ids[0] for row in rows], device=device)
    pad = bucket - len(rows)
    if round_keys and num_keys & (num_keys - 1):
        extra = (1 << num_keys.bit_length()) - num_keys
        read = F.pad(read, (0, extra), value=scratch_slot)
        mask = F.pad(mask, (0, extra), value=False)
        num_keys += extra
    if pad:
        pad_mask = torch.zeros(pad, num_keys, dtype=torch.bool, device=device)
        pad_mask[:, 0] = True  # one visible key: an all-masked row would be NaN
        token_ids = F.pad(token_ids, (0, pad))
        ends = F.pad(ends, (0, pad), value=1)
        write = F.pad(write, (0, pad), value=scratch_slot)
        read = torch.cat([read, read.new_full((pad, num_keys), scratch_slot)])
        mask = torch.cat([mask, pad_mask])
    return token_ids, ends - 1, write, read, mask


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
    them. That path is written but UNTESTED: no GPU was available when it was written.
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
        self.scratch_slot = scratch_block * cache.block_size
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
                eager = min(eager, _best_ms(lambda: paged_forward(model, self.cache, rows), 3))
                graph = min(graph, _best_ms(lambda: self(rows), 3))
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
        inputs = decode_inputs(
            rows,
            self.cache.block_size,
            bucket,
            self.scratch_slot,
            self.cache.device,
            round_keys=self.cache.device.type == "cuda",
        )
        # K (keys per row) changes every step: symbolic, so one graph per bucket serves all.
        torch._dynamo.mark_dynamic(inputs[3], 1)
        torch._dynamo.mark_dynamic(inputs[4], 1)
        with self._inductor_patch, self._dynamo_patch:
            logits = self.compiled(*inputs, self.keys, self.values)
        return logits[: len(rows)]


def _best_ms(step: Callable[[], object], repeats: int = 5) -> float:
    """Fastest of `repeats` calls, in milliseconds (the machine is shared: the minimum is the
    least disturbed)."""
    step()  # the first call warms caches and allocators; it is not timed
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best * 1e3

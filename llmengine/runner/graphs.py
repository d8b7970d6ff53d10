"""The decode step as one compiled graph per batch bucket, on a CPU (the analogue of CUDA
graphs; on CUDA the runner captures `llmengine.runner.cuda_graphs` instead).

A decode step is a fixed chain of operators whose shapes depend only on the batch size and
on how many cached keys the rows read. Eager, every operator pays dispatch, and the matrix
products of a few rows run through MKL's slow matrix-vector path; compiled whole by inductor
with the weights frozen into the graph, the products become inductor's own GEMM template
(max-autotune picks it where it wins), which reads the weights near memory bandwidth.

What is compiled is the model's own forward (`Llama.forward_hidden`, then the head) with
`FlexPagedAttention` as its attention hook: no second copy of the model. Every product's
weight is a parameter (`llmengine.speed.projections.Product`), so freezing folds it in.

The batch is padded up to a bucket (1, 2, 4, 8, ...), so one graph serves several batch
sizes; padding rows write their K/V into a scratch slot that no request reads (the runner
gives the cache one block beyond the pool) and their logits are dropped. The K/V cache
tensors are inputs, mutated in place, never frozen: the same tensors the eager forward and
swaps use. Their shapes depend on the bucket alone, whatever the context length: one graph
per bucket.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.runner.attention import PagedRow
from llmengine.runner.flex_inputs import DecodeInputBuffers, DecodeInputs
from llmengine.runner.paged_flex import FlexPagedAttention, paged_block_mask
from llmengine.sampling import greedy_picks
from llmengine.speed.prepare import PreparedLlama

BUCKETS = (1, 2, 4, 8, 16, 32)
# Inductor settings, chosen by measurement (reports/wallclock/decode-graph.md): frozen weights
# let max-autotune's GEMM template replace MKL for the few-row products.
CPU_OPTIONS: dict[str, object] = {"freezing": True, "max_autotune": True}
# Under tensor parallelism the graph holds the layers' all-reduces, and with max-autotune's
# GEMM template beside them its logits came out wrong (off by about 8 from eager's on a
# random 2-layer model at two ranks, gloo); with frozen weights alone they match.
CPU_OPTIONS_WITH_ALL_REDUCES: dict[str, object] = {"freezing": True}


def buckets_for(num_slots: int, buckets: Sequence[int] = BUCKETS) -> list[int]:
    """The buckets an engine of `num_slots` slots needs: those below it and the first >= it."""
    chosen = [bucket for bucket in buckets if bucket < num_slots]
    return chosen + [next((b for b in buckets if b >= num_slots), num_slots)]


class BucketGraphs:
    """What every kind of decode graph shares: the batch buckets it keeps, the one a decode
    of n rows takes, and the rows it is warmed up on. `table_width` is how many blocks a
    row's table holds in the graph's inputs."""

    buckets: list[int]
    cache: PagedKVCache
    scratch_block: int
    table_width: int
    # The last call's greedy picks `[2, rows]` (argmax, all logits finite), read after it
    # like a captured graph's output buffer; None where the graphs compute none.
    greedy_picks: torch.Tensor | None = None

    def dummy_rows(self, bucket: int) -> list[PagedRow]:
        """`bucket` decode rows of a typical context (four blocks, or `table_width` when that
        is fewer: a wider table has no place in the graph's inputs), all in the scratch
        block: what the graphs are compiled, warmed up and timed on."""
        blocks = min(4, self.table_width)
        context = blocks * self.cache.block_size
        return [PagedRow([0], context - 1, [self.scratch_block] * blocks) for _ in range(bucket)]

    def graph_for(self, num_rows: int) -> int | None:
        """The smallest kept bucket that holds `num_rows` decode rows, or None (run eager)."""
        return next((bucket for bucket in self.buckets if bucket >= num_rows), None)

    def drop(self, bucket: int) -> None:
        """Stop using `bucket`'s graph: its decodes go to a larger bucket, or run eager."""
        self.buckets.remove(bucket)


class CompiledBucket(NamedTuple):
    """What inductor compiled for one bucket: the function and the arguments it takes."""

    function: Callable[..., Any]
    arguments: list[torch.Tensor]


class DecodeGraphs(BucketGraphs):
    """The decode forward compiled for each of `buckets`, each compiled when built.

    `graph_for(n)` is the bucket (or None: run eager) for a decode of n rows; `drop(bucket)`
    takes a bucket out (the runner drops those measured slower than eager). Inductor's
    on-disk caches make a second start in a new process quicker.

    The weights are folded into each graph as they are when it is built: weights changed
    later (a new state dict) are not seen by it.
    """

    def __init__(
        self,
        model: Llama,
        cache: PagedKVCache,
        scratch_block: int,
        buckets: Sequence[int],
        options: dict[str, object] | None = None,
    ) -> None:
        if isinstance(model, PreparedLlama) and model.quantization == "int8":
            # The graph multiplies by the float weights it folds in, not by int8 copies.
            raise ValueError("the decode graph does not take an int8-quantised model")
        self.model = model
        self.cache = cache
        self.scratch_block = scratch_block
        self.table_width = cache.num_blocks  # every row's table padded to the whole pool
        self.keys = [k.flatten(0, 1) for k in cache.keys]
        self.values = [v.flatten(0, 1) for v in cache.values]
        if options is None:
            sharded = dist.is_initialized() and dist.get_world_size() > 1
            options = CPU_OPTIONS_WITH_ALL_REDUCES if sharded else CPU_OPTIONS
        # Dynamo installs the parameters as constants of the graph only when it sees inductor's
        # `freezing` set while it traces; set in `options` alone, the weights stayed inputs of
        # extern `mm` calls and the graph was no faster than eager. One graph per bucket:
        # more than dynamo's default 8 recompiles. Entered around each call, never nested.
        self._inductor_patch = torch._inductor.config.patch(freezing=bool(options.get("freezing")))
        self._dynamo_patch = torch._dynamo.config.patch(recompile_limit=64)
        self._options = options
        self._compiled = torch.compile(
            self._decode, fullgraph=True, dynamic=False, backend=self._inductor
        )
        self._buffers: dict[int, DecodeInputBuffers] = {}
        self._just_compiled: CompiledBucket | None = None  # by the call in progress, if any
        # What each step calls directly, by bucket and torch thread count: inductor writes its
        # CPU kernels for the thread count it compiles at (one compiled at one thread
        # corrupted memory when run at two), and dynamo compiles again when the count changes.
        self._direct: dict[tuple[int, int], CompiledBucket] = {}
        self.compile_seconds: dict[int, float] = {}
        self.buckets = sorted(buckets)
        for bucket in self.buckets:
            start = time.perf_counter()
            with torch.inference_mode():
                self(self.dummy_rows(bucket), bucket)
            self.compile_seconds[bucket] = time.perf_counter() - start

    def _inductor(
        self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
    ) -> Callable[..., Any]:
        """Dynamo's backend: inductor with this graph's options, as `torch.compile(options=...)`
        calls it, keeping what it compiled for the call in progress (`_call_directly`)."""
        # Imported here: inductor pulls in dynamo, which an engine without graphs never needs.
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(graph, example_inputs, config_patches=self._options)
        self._just_compiled = CompiledBucket(compiled, list(example_inputs))
        return compiled

    def _call_directly(self, bucket: int, compiled: CompiledBucket) -> None:
        """Call what dynamo has just compiled for `bucket` at the current thread count
        directly from now on, past dynamo, when every argument it takes is one of the
        bucket's own tensors: its input buffers and the cache's, the same objects at every
        step, so its argument list never changes. Dynamo's call (guards, frame evaluation,
        wrappers) cost a third of a one-row call of the embedded model's graph on a 2-core
        EPYC; what its guards watch cannot change here but the thread count, which the
        direct calls are keyed by: the weights are folded in, the tensors are the same, and
        every call runs under inference mode (checked at each call)."""
        buffers = self._buffers.get(bucket)
        if buffers is None:
            return
        own = [*buffers.inputs[:3], *buffers.inputs[3], *self.keys, *self.values]
        if all(any(argument is tensor for tensor in own) for argument in compiled.arguments):
            self._direct[bucket, torch.get_num_threads()] = compiled

    @property
    def direct_buckets(self) -> list[int]:
        """The buckets whose compiled function each step calls directly, past dynamo, at the
        current torch thread count."""
        threads = torch.get_num_threads()
        return sorted(bucket for bucket, compiled_at in self._direct if compiled_at == threads)

    def _decode(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_indices: torch.Tensor,
        mask_tensors: tuple[torch.Tensor, ...],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """Logits `[B, vocab]` for one new token per row, each row's K/V written at its index,
        and the greedy picks `[2, B]` (each row's argmax, whether its logits are all finite),
        which inductor fuses into the head's last pass: what gets compiled."""
        config = self.model.config  # this rank's heads, under tensor parallelism
        group = config.num_attention_heads // config.num_key_value_heads
        block_mask = paged_block_mask(mask_tensors, keys[0].shape[0], group)
        attention = FlexPagedAttention(keys, values, write_indices, block_mask)
        hidden = self.model.forward_hidden(token_ids[:, None], positions[:, None], attention)
        logits = self.model.compute_logits(hidden[:, 0])
        return logits, greedy_picks(logits)

    def inputs_for(self, rows: Sequence[PagedRow], bucket: int) -> DecodeInputs:
        """The graph's inputs for decode `rows` padded to `bucket`, written into the bucket's
        buffers (`DecodeInputBuffers`): valid until the next call for the same bucket."""
        buffers = self._buffers.get(bucket)
        if buffers is None:
            cache = self.cache
            buffers = DecodeInputBuffers(
                bucket, cache.num_blocks, cache.block_size, self.scratch_block
            )
            self._buffers[bucket] = buffers
        return buffers.fill(rows)

    def __call__(
        self,
        rows: Sequence[PagedRow],
        bucket: int | None = None,
        inputs: DecodeInputs | None = None,
    ) -> torch.Tensor:
        """Logits `[len(rows), vocab]` of a decode step over `rows` (one new token each);
        `inputs` are their `inputs_for` the bucket when the caller built them already."""
        bucket = len(rows) if bucket is None else bucket
        if inputs is None:
            inputs = self.inputs_for(rows, bucket)
        direct = self._direct.get((bucket, torch.get_num_threads()))
        own_inputs = bucket in self._buffers and inputs is self._buffers[bucket].inputs
        if direct is not None and own_inputs and torch.is_inference_mode_enabled():
            logits, picks = direct.function(*direct.arguments)
        else:
            self._just_compiled = None
            with self._inductor_patch, self._dynamo_patch:
                logits, picks = self._compiled(*inputs, self.keys, self.values)
            if self._just_compiled is not None:
                self._call_directly(bucket, self._just_compiled)
        self.greedy_picks = picks[:, : len(rows)]
        return logits[: len(rows)]

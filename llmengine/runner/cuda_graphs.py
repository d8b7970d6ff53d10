"""The decode step captured as one CUDA graph per batch bucket, replayed over fixed buffers.

Each bucket owns persistent inputs (`StepBuffers`) and the static-shape step that reads them
(`static_decode_step`: every layer, the head). At start-up each bucket's step runs a few
times (warm-up: kernels chosen, workspaces allocated) and is then captured with
`torch.cuda.graph` into a graph whose memory comes from one pool shared by all buckets,
largest first, so that the smaller ones reuse its memory. A step then costs one copy of the
staged inputs and one replay: no launch per kernel, no tensor made from Python data.

The step attends with the paged Triton kernel where Triton is installed and the device is
CUDA, else by gathering each row's blocks (`llmengine.runner.static_decode`). A bucket whose
paged step raises at warm-up or capture is built again gathering (`attention` says which each
bucket got, `paged_failure` why the kernel was given up); a bucket whose capture raises
even so is not used (`failures` says why; its decodes go to a larger bucket or run eager):
the engine never fails for it. Without capture (`capture=False`, as on
a CPU) the same buffers and step run eagerly, which is what the CPU tests check the tokens
of. The cache's tensors are the ones the eager forward and swaps use: a replay writes the
new K/V into them in place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.runner import paged_decode
from llmengine.runner.attention import PagedRow
from llmengine.runner.graphs import BucketGraphs
from llmengine.runner.static_decode import ATTENTION, GATHERED, PAGED, static_decode_step
from llmengine.runner.step_buffers import StepBuffers

logger = logging.getLogger("llmengine.runner")

WARMUP_STEPS = 3  # runs before capture: lazy initialisation never happens inside a capture

# One decode step over fixed buffers: its logits and their greedy picks.
Step = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def capture(step: Step, pool: object) -> Step:
    """`step` captured into a CUDA graph from memory `pool`: the replay, which returns the
    graph's own output tensors (logits and greedy picks), refreshed in place."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step()

    def replay() -> tuple[torch.Tensor, torch.Tensor]:
        graph.replay()
        return outputs

    return replay


class StaticDecodeGraphs(BucketGraphs):
    """The decode step for each of `buckets`, over persistent buffers, captured as a CUDA
    graph when `capture` (the default on CUDA), else run eagerly.

    The interface is `DecodeGraphs`'s: `graph_for(n)`, `inputs_for(rows, bucket)`,
    `graphs(rows, bucket, inputs)`, `drop(bucket)`, `dummy_rows(bucket)`. Each row reads
    `width` blocks, its `table_width` (default: as many as the model's longest sequence or
    the pool allows).
    `attention` (None: `default_attention`) is the step's attention, one of `ATTENTION`.
    `warmup_seconds`, `capture_seconds`, `failures`, `attention` (each bucket's) and
    `paged_failure` are what start-up measured.
    """

    def __init__(
        self,
        model: Llama,
        cache: PagedKVCache,
        scratch_block: int,
        buckets: Sequence[int],
        *,
        width: int | None = None,
        capture: bool | None = None,
        attention: str | None = None,
    ) -> None:
        self.model, self.cache, self.scratch_block = model, cache, scratch_block
        longest = blocks_for_length(model.config.max_position_embeddings, cache.block_size)
        self.table_width = min(scratch_block, longest) if width is None else width
        self.capture = cache.device.type == "cuda" if capture is None else capture
        wanted = default_attention(cache.device) if attention is None else attention
        if wanted not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {wanted!r}")
        self.buffers = {
            bucket: StepBuffers(
                bucket, self.table_width, cache.block_size, scratch_block, cache.device
            )
            for bucket in buckets
        }
        self._steps: dict[int, Step] = {}
        self.attention = dict.fromkeys(self.buffers, wanted)
        self.paged_failure: str | None = None
        self.warmup_seconds: dict[int, float] = {}
        self.capture_seconds: dict[int, float] = {}
        self.failures: dict[int, str] = {}
        self._pool: object = None  # the graphs' shared memory, made with the first capture
        with torch.inference_mode():
            for bucket in sorted(self.buffers, reverse=True):
                self._build(bucket)
        self.buckets = sorted(bucket for bucket in self.buffers if bucket not in self.failures)

    @property
    def compile_seconds(self) -> dict[int, float]:
        """Start-up's time per bucket: warm-up and capture together."""
        return {
            bucket: self.warmup_seconds.get(bucket, 0.0) + self.capture_seconds.get(bucket, 0.0)
            for bucket in self.buffers
        }

    def _step(self, bucket: int) -> Step:
        """`bucket`'s step, uncaptured, with its attention."""
        model, cache, buffers = self.model, self.cache, self.buffers[bucket]
        dtype = cache.keys[0].dtype  # the attention's, whatever the weights are stored in
        attention = self.attention[bucket]
        return lambda: static_decode_step(model, cache, buffers, dtype, attention)

    def _build(self, bucket: int) -> None:
        """Warm `bucket`'s step up on its padding rows, then capture it (when capturing).
        A paged step that raises is built again gathering, and so is every bucket after it;
        a fault of the gathered step leaves the bucket out, with why, and runs its decodes
        eager."""
        if self.paged_failure is not None:
            self.attention[bucket] = GATHERED
        self._steps[bucket] = step = self._step(bucket)
        cuda = self.cache.device.type == "cuda"
        try:
            start = time.perf_counter()
            self._warm_up(step, cuda)
            self.warmup_seconds[bucket] = time.perf_counter() - start
            if self.capture:
                start = time.perf_counter()
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                self._steps[bucket] = capture(step, self._pool)
                if cuda:
                    torch.cuda.synchronize()
                self.capture_seconds[bucket] = time.perf_counter() - start
        except Exception as error:  # a device or kernel the capture cannot take: eager instead
            reason = f"{type(error).__name__}: {error}"
            if self.attention[bucket] == PAGED:
                self.paged_failure = reason
                logger.warning("paged decode attention given up, gathering instead: %s", reason)
                self._build(bucket)
                return
            self.failures[bucket] = reason
            logger.warning("decode graph of bucket %d left out: %s", bucket, reason)

    def _warm_up(self, step: Step, cuda: bool) -> None:
        """Run `step` a few times; on CUDA on a side stream, as capture wants it."""
        if not cuda:
            for _ in range(WARMUP_STEPS if self.capture else 1):
                step()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def inputs_for(self, rows: Sequence[PagedRow], bucket: int) -> StepBuffers:
        """Stage decode `rows` padded to `bucket` in its buffers' host side (ValueError for a
        row that does not fit them): what `__call__` uploads and runs."""
        buffers = self.buffers[bucket]
        buffers.fill(rows)
        return buffers

    def __call__(
        self,
        rows: Sequence[PagedRow],
        bucket: int | None = None,
        inputs: StepBuffers | None = None,
    ) -> torch.Tensor:
        """Logits `[len(rows), vocab]` of a decode step over `rows`; `inputs` are their
        staged buffers when the caller staged them already. On CUDA the logits are the
        graph's own tensor: valid until the next step of the bucket. So are the rows'
        `greedy_picks`, which the step computes with them."""
        bucket = self.graph_for(len(rows)) if bucket is None else bucket
        assert bucket is not None, f"no kept bucket holds {len(rows)} rows"
        buffers = self.inputs_for(rows, bucket) if inputs is None else inputs
        buffers.upload()
        logits, picks = self._steps[bucket]()
        self.greedy_picks = picks[:, : len(rows)]
        return logits[: len(rows)]


def default_attention(device: torch.device) -> str:
    """The paged kernel on CUDA where Triton is installed; gathering everywhere else (on a
    CPU the kernel runs only in Triton's interpreter, which the tests ask for by name)."""
    return PAGED if device.type == "cuda" and paged_decode.available() else GATHERED

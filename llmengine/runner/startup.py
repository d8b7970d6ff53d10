"""What the model runner measures once, at start-up, to choose how it runs.

`decode_graph=True` asks for the graphs that pay: each bucket's graph is timed against the
eager forward on the same dummy decode, and a bucket whose graph is not faster is dropped, so
the graph never makes a step slower. Timing happens here, before the first request, and
never again: the step itself only looks up the buckets that were kept. `graph_report` says
what start-up spent on each bucket (compiling, or warming up and capturing a CUDA graph) and
which buckets were left out and why; the runner logs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from llmengine.runner.attention import PagedRow
from llmengine.runner.cuda_graphs import StaticDecodeGraphs
from llmengine.runner.graphs import DecodeGraphs

ROUNDS = 3  # eager and graph timed in turn, so a neighbour's burst of load hits both alike


def drop_slower_graphs(
    graphs: DecodeGraphs | StaticDecodeGraphs, eager: Callable[[list[PagedRow]], torch.Tensor]
) -> None:
    """Time every bucket's graph against `eager` on its dummy rows, and drop the buckets whose
    graph is not faster."""
    with torch.inference_mode():
        for bucket in list(graphs.buckets):
            rows = graphs.dummy_rows(bucket)
            eager_ms = graph_ms = float("inf")
            for _ in range(ROUNDS):
                eager_ms = min(eager_ms, best_ms(lambda rows=rows: eager(rows), 3))
                graph_ms = min(graph_ms, best_ms(lambda rows=rows, b=bucket: graphs(rows, b), 3))
            if graph_ms >= eager_ms:
                graphs.drop(bucket)


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


def graph_report(graphs: DecodeGraphs | StaticDecodeGraphs) -> str:
    """One line per bucket of what start-up spent on it, and the buckets in use.

    For captured graphs, the attention, the warm-up and capture seconds, or why the bucket
    was left out (its decodes run eager), and why the paged kernel was given up if it was;
    for compiled ones, the compile seconds and whether the compiled function is called
    directly (`DecodeGraphs.direct_buckets`)."""
    lines = [f"decode graph buckets in use: {graphs.buckets or 'none (every step eager)'}"]
    if isinstance(graphs, StaticDecodeGraphs):
        for bucket in sorted(graphs.buffers):
            if bucket in graphs.failures:
                lines.append(f"  bucket {bucket}: left out, eager: {graphs.failures[bucket]}")
                continue
            warmup = graphs.warmup_seconds[bucket]
            captured = graphs.capture_seconds.get(bucket)
            how = f"capture {captured:.3f} s" if captured is not None else "not captured"
            attention = f"{graphs.attention[bucket]} attention"
            lines.append(f"  bucket {bucket}: {attention}, warm-up {warmup:.3f} s, {how}")
        if graphs.paged_failure is not None:
            lines.append(f"  paged attention given up: {graphs.paged_failure}")
    else:
        for bucket, seconds in sorted(graphs.compile_seconds.items()):
            how = "called directly" if bucket in graphs.direct_buckets else "called through dynamo"
            lines.append(f"  bucket {bucket}: compiled in {seconds:.3f} s, {how}")
    return "\n".join(lines)

"""The paged decode kernel's checks that need Triton's interpreter, run by
tests/test_paged_decode.py in a process of its own: the interpreter is chosen by
`TRITON_INTERPRET=1` when Triton is first imported, so it cannot be switched on inside a test
process that imported Triton already. (That test imports `PagedEngine` from here too.)

1. Its numbers equal those of attention over the rows' gathered keys, for grouped and plain
   heads, head dims and groups that are not powers of two, lengths on and off a block's
   edge, tables whose blocks are scattered through the pool and read through a transposed
   view (as `StepBuffers` holds them); in float32 and bfloat16.
2. The static decode step with the paged attention, run uncaptured on the CPU, gives the eager
   engine's tokens under the decode-graph tests' workload (preemption, swap, prefix caching,
   seeded sampling), its buckets paged, none given up.
"""

from __future__ import annotations

import functools
import os

import torch
from test_decode_graph import POOL, TINY, run, workload
from test_static_decode import StaticEngine, StaticRunner

import llmengine.runner.cuda_graphs as cuda_graphs
from llmengine.bench.decode_step import random_llama
from llmengine.engine import Engine
from llmengine.runner import paged_decode
from llmengine.runner.static_decode import grouped_decode_attention

# rows, heads, kv heads, head dim, block size, table width
SHAPES = [(3, 8, 2, 16, 4, 6), (2, 4, 4, 8, 16, 2), (4, 6, 2, 12, 4, 5), (1, 8, 4, 32, 16, 3)]


def gathered_reference(q, keys, values, tables, lengths, block_size):
    """Attention over each row's whole table gathered, positions past its length masked."""
    rows, width = tables.shape
    offsets = torch.arange(block_size, device=q.device)
    slots = (tables[:, :, None] * block_size + offsets).flatten()
    shape = (rows, width * block_size, *keys.shape[1:])
    gathered_keys = keys.index_select(0, slots).view(shape).float()
    gathered_values = values.index_select(0, slots).view(shape).float()
    visible = torch.arange(width * block_size, device=q.device) < lengths[:, None]
    mask = torch.zeros(visible.shape, device=q.device).masked_fill(~visible, float("-inf"))
    return grouped_decode_attention(q.float(), gathered_keys, gathered_values, mask[:, None, None])


def check_numbers(device: str = "cpu") -> None:
    """Every shape of `SHAPES`, in float32 and bfloat16, made on the CPU and run on `device`
    (tests/test_cuda.py runs it on CUDA, compiled)."""
    generator = torch.Generator().manual_seed(0)
    for rows, heads, kv_heads, head_dim, block_size, width in SHAPES:
        pool = width * rows + 3
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            keys, values = torch.randn(
                2, pool * block_size, kv_heads, head_dim, generator=generator
            )
            q = torch.randn(rows, 1, heads, head_dim, generator=generator)
            keys, values, q = keys.to(dtype), values.to(dtype), q.to(dtype)
            order = torch.randperm(pool, generator=generator)[: rows * width]
            tables = order.view(width, rows).t()  # a transposed view, as StepBuffers has it
            edges = [1, block_size, block_size + 1, width * block_size]
            lengths = torch.tensor([edges[row % len(edges)] for row in range(rows)])
            q, keys, values = q.to(device), keys.to(device), values.to(device)
            tables, lengths = tables.to(device), lengths.to(device)
            got = paged_decode.paged_decode_attention(q, keys, values, tables, lengths, block_size)
            assert got.shape == q.shape and got.dtype == dtype
            expected = gathered_reference(q, keys, values, tables, lengths, block_size)
            torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


class PagedRunner(StaticRunner):
    def decode_graphs_class(self):
        return functools.partial(cuda_graphs.StaticDecodeGraphs, capture=False, attention="paged")


class PagedEngine(StaticEngine):
    def runner_for(self, model, tokenizer):
        return PagedRunner(model, self.config, tokenizer=tokenizer)


def check_engine() -> None:
    tiny = random_llama(TINY, seed=3, std=0.2)
    prompts, params = workload(seed=0, count=5)
    eager = run(Engine(tiny, **POOL), prompts, params)[0]
    engine = PagedEngine(tiny, decode_graph=(2, 4), **POOL)
    tokens, used, preempted = run(engine, prompts, params)
    graphs = engine.runner.graphs
    assert graphs.attention == {2: "paged", 4: "paged"} and graphs.paged_failure is None
    assert sum(used) > 0 and preempted > 0
    assert tokens == eager


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1" and paged_decode.interpreted()
    check_numbers()
    check_engine()
    print("paged decode attention: every check passed in Triton's interpreter")

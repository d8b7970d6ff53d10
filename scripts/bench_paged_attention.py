"""Time one layer's decode attention four ways, for the attention shapes of the 25M and 100M
models: eager (keys copied out of the pool position by position, then SDPA: what
`paged_forward` does), the same compiled by inductor, and `flex_attention` reading the pool in
place through a block mask, with each query head its own head (`enable_gqa`) or with the query
heads that share a K/V head as its query positions (`paged_decode_attention`: what
`llmengine.runner.graphs` does).

Each row owns its own blocks, scattered over the pool, and reads a random length between half
the context and the context. Times are the fastest of interleaved rounds: the machine is shared.

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_paged_attention.py [--rounds N]
A wall-clock benchmark, not a test: its numbers belong to the machine that ran it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

from llmengine.bench.decode_step import HELD_OUT_CONFIG, SHAPE_100M_CONFIG
from llmengine.bench.throughput import cpu_model
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import grouped_query_attention
from llmengine.runner.attention import flat_indices
from llmengine.runner.flex_inputs import block_mask_tensors
from llmengine.runner.paged_flex import paged_block_mask, paged_decode_attention
from llmengine.runner.startup import best_ms

ROWS = (1, 8, 32)
CONTEXTS = (128, 512, 2048)
BLOCK_SIZE = 16
THREADS = 1  # as the decode-graph benchmark: two threads on a shared 2-core machine wait
REPORT = Path(__file__).resolve().parents[1] / "reports" / "wallclock" / "paged-attention.md"


def gathered(q, read, mask, keys, values):
    """The eager forward's way: copy each row's keys out, then attend over the copy."""
    return grouped_query_attention(q, keys[read], values[read], mask=mask[:, None, None])


def in_place_per_head(q, mask_tensors, keys, values):
    """flex_attention with one query position per row and the query heads as heads."""
    rows = q.shape[0]
    out = flex_attention(
        q.transpose(1, 2),
        keys.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        values.transpose(0, 1)[None].expand(rows, -1, -1, -1),
        block_mask=paged_block_mask(mask_tensors, keys.shape[0]),
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def in_place(q, mask_tensors, keys, values):
    """The decode graph's way: each K/V head's query heads as its query positions."""
    group = q.shape[2] // keys.shape[1]
    mask = paged_block_mask(mask_tensors, keys.shape[0], group)
    return paged_decode_attention(q, keys, values, mask)


def case(config: LlamaConfig, rows: int, context: int, seed: int = 0) -> dict[str, object]:
    """Inputs for `rows` decode rows of up to `context` keys in a pool that holds them all."""
    generator = torch.Generator().manual_seed(seed)
    per_row = -(-context // BLOCK_SIZE)
    num_blocks = rows * per_row + 1
    shape = (num_blocks * BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    keys, values = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    ends = torch.randint(context // 2, context + 1, (rows,), generator=generator)
    tables = torch.randperm(num_blocks, generator=generator)[: rows * per_row].view(rows, -1)
    positions = torch.arange(int(ends.max())).expand(rows, -1)
    q = torch.randn(rows, 1, config.num_attention_heads, config.head_dim, generator=generator)
    padded = torch.nn.functional.pad(tables, (0, num_blocks - per_row))
    return {
        "q": q,
        "keys": keys,
        "values": values,
        "read": flat_indices(tables, positions, BLOCK_SIZE),
        "mask": positions < ends[:, None],
        "mask_tensors": block_mask_tensors(ends, padded, BLOCK_SIZE),
    }


def measure(config: LlamaConfig, rounds: int) -> list[tuple[int, int, float, float, float, float]]:
    compiled_gathered = torch.compile(gathered, dynamic=False)
    compiled_per_head = torch.compile(in_place_per_head, dynamic=False)
    compiled_in_place = torch.compile(in_place, dynamic=False)
    results = []
    for rows in ROWS:
        for context in CONTEXTS:
            c = case(config, rows, context)
            eager_args = (c["q"], c["read"], c["mask"], c["keys"], c["values"])
            flex_args = (c["q"], c["mask_tensors"], c["keys"], c["values"])
            expected = gathered(*eager_args)
            torch.testing.assert_close(compiled_per_head(*flex_args), expected)
            torch.testing.assert_close(compiled_in_place(*flex_args), expected)
            best = [float("inf")] * 4
            for _ in range(rounds):
                calls = (
                    (gathered, eager_args),
                    (compiled_gathered, eager_args),
                    (compiled_per_head, flex_args),
                    (compiled_in_place, flex_args),
                )
                times = [best_ms(lambda f=f, a=a: f(*a), 10) for f, a in calls]
                best = [min(b, t) for b, t in zip(best, times, strict=True)]
            results.append((rows, context, *best))
            print(rows, context, best, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    torch._dynamo.config.recompile_limit = 64  # one compile per pool size, each function
    load_before = os.getloadavg()
    tables = []
    for name, config in (("25M", HELD_OUT_CONFIG), ("100M", SHAPE_100M_CONFIG)):
        heads = f"{config.num_attention_heads} heads, {config.num_key_value_heads} KV heads"
        tables += [
            f"## {name} model ({heads}, head dim {config.head_dim})",
            "",
            "| rows | context | eager gather ms | compiled gather ms | in place (flex) ms "
            "| in place / eager | in place / compiled gather | in place, per head ms "
            "| in place / per head |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        with torch.inference_mode():
            for rows, context, eager, compiled, per_head, flex in measure(config, args.rounds):
                tables.append(
                    f"| {rows} | {context} | {eager:.3f} | {compiled:.3f} | {flex:.3f} "
                    f"| {eager / flex:.2f}x | {compiled / flex:.2f}x | {per_head:.3f} "
                    f"| {per_head / flex:.2f}x |"
                )
        tables.append("")
    load_after = os.getloadavg()
    header = [
        "# Decode attention: keys copied out of the pool, or read where they live",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{THREADS} torch thread; load average {load_before[0]:.2f} at start, "
        f"{load_after[0]:.2f} at the end. One layer's attention for one decode query per row, "
        f"float32, blocks of {BLOCK_SIZE}; each row reads between half the context and the "
        f"context. Fastest of {args.rounds} interleaved rounds of 10 calls. The ratios are "
        "speed-ups of reading in place as the decode graph does (above 1: in place is "
        "faster): the query heads that share a K/V head are its query positions, so each "
        "block is read once for them all. In place, per head: each query head is a head of "
        "its own (`enable_gqa`) and reads its K/V head's blocks itself. `scripts/"
        "bench_paged_attention.py` wrote this file.",
        "",
    ]
    REPORT.write_text("\n".join(header + tables))
    print(REPORT.read_text())


if __name__ == "__main__":
    main()

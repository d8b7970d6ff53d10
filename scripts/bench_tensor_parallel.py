"""What tensor parallelism costs on this machine: decode steps at 1 and 2 ranks, and the
all-reduces between them (gloo over 127.0.0.1).

For the embedded model in float32 with eager kernels: the mean time of a decode step at a
few batch sizes on one process and on two ranks (rounds interleaved), the parameter bytes
rank 0 holds, and the all-reduces a step makes (two per layer, rows x hidden float32 each)
with the time one such all-reduce takes alone between two processes. Writes
`reports/wallclock/tensor-parallel.md`.

Usage: bench_tensor_parallel.py [--rows 1,8] [--steps 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import llmengine
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.lessons.tensor_parallel import decode_step_ms, parameter_bytes, time_all_reduces
from llmengine.model.sharding import Shard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows_list = [int(part) for part in args.rows.split(",")]
    torch.set_num_threads(1)
    path = llmengine.embedded_model_path()
    config = llmengine.LlamaConfig.from_file(path / "config.json")
    memory_rows = [
        [ranks, parameter_bytes(llmengine.load_model(path, kernels="eager", shard=shard)) / 2**20]
        for ranks, shard in ((1, None), (2, Shard(0, 2)))
    ]
    step_rows, reduce_rows = [], []
    options = {"num_blocks": 64, "block_size": 16, "num_slots": max(rows_list)}
    for rows in rows_list:
        timings: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):  # interleaved: one process, then two ranks, again
            alone = llmengine.Engine(llmengine.load_model(path, kernels="eager"), **options)
            timings[1].append(decode_step_ms(alone, rows, args.steps))
            with llmengine.start_tensor_parallel(
                path, tensor_parallel_size=2, kernels="eager", **options
            ) as ranks:
                timings[2].append(decode_step_ms(ranks, rows, args.steps))
        one, two = statistics.median(timings[1]), statistics.median(timings[2])
        step_rows.append([rows, one, two, one / two])
        size = rows * config.hidden_size * 4
        reduces = 2 * config.num_hidden_layers
        (alone_us,) = time_all_reduces([(rows, config.hidden_size)])
        reduce_rows.append([rows, reduces, size, alone_us])
    load = os.getloadavg()[0]
    text = (
        f"# Tensor parallelism on this machine\n\nThe embedded model; {os.cpu_count()} CPUs, "
        f"load {load:.1f}, one thread per rank, float32, eager kernels, gloo over 127.0.0.1, "
        f"median of {args.rounds} interleaved rounds of {args.steps} decode steps.\n\n"
        "## Decode step\n\n"
        + markdown_table(step_rows, ["rows", "1 rank (ms)", "2 ranks (ms)", "speed-up"],
                         ["d", ".2f", ".2f", ".2f"])
        + "\n## Parameters held by rank 0\n\n"
        + markdown_table(memory_rows, ["ranks", "MiB"], ["d", ".2f"])
        + "\n## All-reduces of a decode step\n\n"
        + markdown_table(reduce_rows, ["rows", "per step", "bytes each", "one alone (us)"],
                         ["d", "d", "d", ".0f"])
    )  # fmt: skip
    print(text)
    write_report("tensor-parallel", text, wallclock=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import llmengine
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.parallel.cluster import Cluster
from llmengine.parallel.sharding import Shard

PROMPT = list(range(3, 19))


def decode_step_ms(engine: llmengine.Engine, rows: int, steps: int) -> float:
    """Mean ms of a decode step with `rows` requests running (their prefill excluded)."""
    params = llmengine.SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    engine.add_requests([PROMPT] * rows, params)
    engine.step()  # the prefills
    engine.step()  # one decode to warm up
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = (time.perf_counter() - start) / steps * 1e3
    while engine.has_unfinished():
        engine.step()
    return elapsed


def parameter_bytes(path: Path, shard: Shard | None) -> int:
    """Bytes of the parameters one rank holds (the whole model when `shard` is None)."""
    model = llmengine.load_model(path, kernels="eager", shard=shard)
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def all_reduce_us(
    rank: int, port: int, shape: tuple[int, int], repeats: int, out: mp.Queue
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    tensor = torch.ones(shape)
    for _ in range(5):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(tensor)
    if rank == 0:
        out.put((time.perf_counter() - start) / repeats * 1e6)
    dist.destroy_process_group()


def time_all_reduce(shape: tuple[int, int], repeats: int = 200) -> float:
    """Microseconds of one all-reduce of a `shape` float32 tensor between two processes."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = Cluster(2).with_port().master_port
    ranks = [
        context.Process(target=all_reduce_us, args=(r, port, shape, repeats, queue)) for r in (0, 1)
    ]
    for process in ranks:
        process.start()
    result = queue.get(timeout=120)
    for process in ranks:
        process.join(60)
    return result


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
        [ranks, parameter_bytes(path, shard) / 2**20]
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
        reduce_rows.append([rows, reduces, size, time_all_reduce((rows, config.hidden_size))])
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

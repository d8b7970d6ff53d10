"""Time the decode step eager against its compiled graph, per bucket (`runner.graphs`).

For the embedded model and the 25M random model (`HELD_OUT_CONFIG`), each in two fresh
processes sharing one new inductor cache directory: the first start compiles every bucket
from nothing, the second finds inductor's on-disk caches. The first process then times one
decode step (the forward, `paged_forward` eager against the graph, each row reading
`--context` keys of its own blocks) in interleaved rounds, keeping each one's fastest: the
machine is shared, and the minimum is the least disturbed. With `--settings`, the 25M model
is also compiled under each inductor setting of `SETTINGS` (first start, buckets 1 and 32).

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_decode_graph.py [--rounds N] [--settings]
A wall-clock benchmark, not a test: its numbers belong to the machine that ran it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

BUCKETS = (1, 2, 4, 8, 16, 32)
CONTEXT = 128
# One thread: on a shared 2-core machine two OpenMP threads wait at every barrier for a
# descheduled partner (eager steps were measured 3-10x slower under a load of 5).
THREADS = 1
SETTINGS: dict[str, dict[str, object]] = {
    "default": {},
    "freezing": {"freezing": True},
    "freezing + max_autotune": {"freezing": True, "max_autotune": True},
    "freezing + max_autotune + cpp_wrapper": {
        "freezing": True,
        "max_autotune": True,
        "cpp_wrapper": True,
    },
}
NOTES = """## Notes

- Freezing has to be on while dynamo traces, not only in inductor's options: set through
  `torch.compile(options=...)` alone, dynamo lifted the weights to graph inputs, they reached
  inductor as arguments of extern `mm` calls, and the one-row graph ran no faster than
  eager. `DecodeGraphs` patches `torch._inductor.config.freezing` around its compiles and
  calls.
- Attention reads the pool in place (`flex_attention` with a block mask as wide as the pool,
  reports/wallclock/paged-attention.md), so no input's shape depends on the context length:
  one compile per bucket serves every length.
- One torch thread: under a shared machine's load, two OpenMP threads made both eager and
  graph steps several times slower and erratic, each waiting at every barrier for a
  descheduled partner.
- A bucket whose graph is slower than eager (a speed-up under 1x above) is dropped when an
  engine is built: the engine measures each bucket the same way at its start, so the graph
  never makes a step slower on the machine it runs on.
- Sampling stays outside the graph: it is per request (seeds, temperature, penalties), and a
  greedy argmax over `[B, vocab]` costs microseconds beside these steps.
"""
SETTINGS_NOTE = """- The settings table compiles the 25M model afresh under each setting;
  cpp_wrapper is not in `CPU_OPTIONS` unless its rows show a gain beyond this machine's noise.
"""
REPORT = Path(__file__).resolve().parents[1] / "reports" / "wallclock" / "decode-graph.md"


def load(name: str) -> torch.nn.Module:
    import llmengine
    from llmengine.bench.decode_step import HELD_OUT_CONFIG, random_llama
    from llmengine.speed.prepare import prepare_for_speed

    if name == "embedded":
        return llmengine.load_model()
    return prepare_for_speed(random_llama(HELD_OUT_CONFIG))  # as load_model prepares it


def worker(args: argparse.Namespace) -> dict[str, object]:
    """One process: build the graphs, and time them against eager when `args.time`."""
    from llmengine.kv.paged_cache import PagedKVCache
    from llmengine.runner.attention import PagedRow
    from llmengine.runner.forward import paged_forward
    from llmengine.runner.graphs import CPU_OPTIONS, DecodeGraphs
    from llmengine.runner.startup import best_ms

    torch.set_num_threads(args.threads)  # before compiling: inductor bakes it into its loops
    model = load(args.model)
    buckets = [int(b) for b in args.buckets.split(",")]
    per_row = -(-args.context // 16)
    cache = PagedKVCache(model.config, max(buckets) * per_row + 1, 16)
    scratch = cache.num_blocks - 1
    options = SETTINGS[args.setting] if args.setting else CPU_OPTIONS
    start = time.perf_counter()
    graphs = DecodeGraphs(model, cache, scratch, buckets, options=options)
    result: dict[str, object] = {
        "build_s": time.perf_counter() - start,
        "compile_s": graphs.compile_seconds,
        "load": os.getloadavg(),
    }
    if args.time:
        best: dict[int, list[float]] = {b: [float("inf")] * 2 for b in buckets}
        with torch.inference_mode():
            for _ in range(args.rounds):
                for bucket in buckets:
                    rows = [
                        PagedRow([7], args.context - 1, list(range(i * per_row, (i + 1) * per_row)))
                        for i in range(bucket)
                    ]
                    eager = best_ms(lambda rows=rows: paged_forward(model, cache, rows))
                    graph = best_ms(lambda rows=rows: graphs(rows))
                    best[bucket] = [min(best[bucket][0], eager), min(best[bucket][1], graph)]
        result["step_ms"] = best
        result["load_after"] = os.getloadavg()
    return result


def spawn(
    model: str, cache_dir: str, *, buckets: str, timed: bool, setting: str = "", rounds: int = 5
) -> dict:
    """Run `worker` in a new process with its own inductor cache directory."""
    command = [sys.executable, __file__, "--worker", model, "--buckets", buckets]
    command += ["--rounds", str(rounds), "--context", str(CONTEXT)]
    command += ["--threads", str(THREADS)] + (["--time"] if timed else [])
    command += ["--setting", setting] if setting else []
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    print(model, setting or "chosen", "timed" if timed else "", result, file=sys.stderr)
    return result


def loads(values: list[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None)
    parser.add_argument("--buckets", default=",".join(map(str, BUCKETS)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context", type=int, default=CONTEXT)
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--setting", default="")
    parser.add_argument("--settings", action="store_true")
    parser.add_argument("--models", default="embedded,25M")
    args = parser.parse_args()
    if args.worker:
        args.model = args.worker
        print(json.dumps(worker(args)))
        return
    from llmengine.bench.throughput import cpu_model
    from llmengine.runner.graphs import CPU_OPTIONS

    lines = [
        "# The decode step as one graph per bucket, against eager",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{THREADS} torch thread; load average at start "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: times are the "
        f"fastest of {args.rounds} interleaved rounds of 5 calls). Inductor options: "
        f"`{CPU_OPTIONS}`. One decode step's forward (`paged_forward` against the graph, "
        f"sampling excluded), every row reading {args.context} cached keys.",
        "",
    ]
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache_dir:
            first = spawn(model, cache_dir, buckets=args.buckets, timed=True, rounds=args.rounds)
            second = spawn(model, cache_dir, buckets=args.buckets, timed=False)
        lines += [
            f"## {model} model",
            "",
            f"Load average (1, 5, 15 min) during the timing: {loads(first['load'])} to "
            f"{loads(first['load_after'])}. "
            f"Whole process, first start {first['process_s']:.0f} s (timing included), "
            f"second start {second['process_s']:.0f} s.",
            "",
            "| bucket | eager ms | graph ms | eager tok/s | graph tok/s | speed-up "
            "| compile s, first start | compile s, second start |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for bucket in args.buckets.split(","):
            eager, graph = first["step_ms"][bucket]
            lines.append(
                f"| {bucket} | {eager:.2f} | {graph:.2f} | {int(bucket) * 1e3 / eager:.0f} "
                f"| {int(bucket) * 1e3 / graph:.0f} | {eager / graph:.2f}x "
                f"| {first['compile_s'][bucket]:.1f} | {second['compile_s'][bucket]:.1f} |"
            )
        lines.append("")
    if args.settings:
        lines += [
            "## Inductor settings (25M model, first start, fresh cache each)",
            "",
            "| setting | bucket | eager ms | graph ms | compile s |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in SETTINGS:
            with tempfile.TemporaryDirectory() as cache_dir:
                result = spawn("25M", cache_dir, buckets="1,32", timed=True, setting=name, rounds=3)
            for bucket in ("1", "32"):
                eager, graph = result["step_ms"][bucket]
                lines.append(
                    f"| {name} | {bucket} | {eager:.2f} | {graph:.2f} "
                    f"| {result['compile_s'][bucket]:.1f} |"
                )
        lines.append("")
    notes = NOTES + (SETTINGS_NOTE if args.settings else "")
    REPORT.write_text("\n".join(lines) + "\n" + notes, encoding="utf-8")
    print(REPORT)


if __name__ == "__main__":
    main()

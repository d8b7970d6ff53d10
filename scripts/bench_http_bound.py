"""What bounds llmengine over HTTP: the same burst in-process, and served at 1 and 2 threads.

`make peers` serves the embedded model's mixed burst (48 requests at once, 16 slots) with
the decode graph and compares it with `llama-server`. This script runs that burst in
interleaved rounds on one machine: through an `Engine` in the script's own process (no
HTTP), through `llmengine serve --decode-graph` with its forward on 1 and on 2 threads
(`--engine-threads`), the engine on a thread of the server's process (`--no-engine-process`)
and in a process of its own (`serve`'s default), and through `llama-server` (on 2 threads as
`make peers` runs it, and on 1) where `make peers` built it. Every server is started first;
each burst then runs with the others idle, through the same streaming client (`llmengine
bench --url`'s, in this process). If the served rate does not follow the forward's threads
while the in-process rate is far above it, the server is bound by its Python work (the
engine's host work, the HTTP side, the client), not by the forward's arithmetic. Each served
burst also counts the CPU seconds the server and the client used
(`llmengine.bench.cpu_time`): a server bound by its cores leaves none of them idle, one
whose threads wait for each other does. Writes `reports/wallclock/http-bound.md`.

Usage: .venv/bin/python scripts/bench_http_bound.py [--rounds R] [--skip-llamacpp]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

import llmengine
from llmengine.bench import throughput
from llmengine.bench.cpu_time import idle_share, process_cpu_seconds
from llmengine.bench.http_client import run_over_http, served_model
from llmengine.bench.peers import llamacpp, plan, rounds, servers
from llmengine.bench.peers.results import current_load
from llmengine.bench.serving_report import run_summary
from llmengine.bench.workloads import RequestSpec
from llmengine.cli.serve import forward_threads
from llmengine.lessons.artifacts import machine_line, markdown_table, write_report

REPORT = "http-bound"
SLOTS = plan.HTTP_SLOTS  # as make peers' HTTP rows
SERVED_THREADS = (1, 2)
ON_A_THREAD, IN_A_PROCESS = "served", "engine process"  # where the server's engine runs
LLAMA_SERVER = "llama-server"
IN_PROCESS_THREADS = 2  # and llama-server's, as make peers runs it
IN_PROCESS = "in-process"
CALL_TIMEOUT_S = 300.0
CORES = len(os.sched_getaffinity(0))  # the servers and the client share these


def serve_command(threads: int, own_process: bool = False) -> tuple[list[str], dict[str, str]]:
    """`llmengine serve` with the decode graph as `make peers` runs it, its forward on
    `threads` torch threads, its engine in a process of its own if `own_process` (else on a
    thread of the server's process), and its environment."""
    checkpoint = llmengine.embedded_model_path()
    command = rounds.llmengine_serve_command(
        sys.executable, checkpoint, decode_graph=True, engine_process=own_process
    )
    return command + ["--engine-threads", str(threads)], plan.thread_env(threads)


def way_of(where: str, threads: int) -> str:
    return f"{where}, {threads} thread(s)"


def llama_server(threads: int) -> tuple[list[str], dict[str, str]] | None:
    """`llama-server` on the embedded model's f32 GGUF as `make peers` serves it, from the
    binaries `make peers` built into `.cache/peers/` (None, saying why, where they are not)."""
    cache = plan.cache_dir()
    try:
        llama = llamacpp.prepare(cache, build=False)
        gguf = llamacpp.convert(
            llama, llmengine.embedded_model_path(), cache / "gguf" / "embedded.gguf"
        )
        command = llamacpp.server_command(llama, gguf, SLOTS, threads)
    except (OSError, RuntimeError) as error:
        print(f"llama-server left out: {error}", flush=True)
        return None
    return command, plan.thread_env(threads)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--skip-llamacpp", action="store_true")
    args = parser.parse_args(argv)
    model = llmengine.load_model()
    burst = plan.mixed_burst(plan.HTTP_REQUESTS, model.config.vocab_size)
    torch.set_num_threads(IN_PROCESS_THREADS)  # the in-process graph is compiled for these
    engine = llmengine.Engine(
        model, num_blocks=plan.HTTP_BLOCKS, block_size=16, num_slots=SLOTS, decode_graph=True
    )
    commands = {way_of(ON_A_THREAD, t): serve_command(t) for t in SERVED_THREADS}
    commands |= {
        way_of(IN_A_PROCESS, t): serve_command(t, own_process=True) for t in SERVED_THREADS
    }
    # llama-server as make peers runs it first (the row the ratios take), then on 1 thread.
    for threads in () if args.skip_llamacpp else (IN_PROCESS_THREADS, 1):
        peer = llama_server(threads)
        if peer is not None:
            commands[way_of(LLAMA_SERVER, threads)] = peer
    rows: dict[str, list[dict[str, float]]] = {IN_PROCESS: [], **{way: [] for way in commands}}
    started = time.perf_counter()
    with contextlib.ExitStack() as running:
        urls, pids = {}, {}
        for index, (way, (command, env)) in enumerate(commands.items()):
            log = plan.cache_dir() / "logs" / f"http-bound-{index}.log"
            urls[way], process = running.enter_context(
                servers.started(command, env=env, log=log, start_timeout=1800)
            )
            pids[way] = process.pid
        throughput.run_on_engine(engine, burst)  # warm-ups, untimed
        for url in urls.values():
            run_over_http(f"{url}/v1", served_model(f"{url}/v1"), burst, timeout=CALL_TIMEOUT_S)
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", flush=True)
            load = current_load()
            run = throughput.run_on_engine(engine, burst)
            rows[IN_PROCESS].append({"tok/s": run.tokens_per_s, "load": load})
            for way, url in urls.items():
                rows[way].append(served_burst(f"{url}/v1", pids[way], burst))
    print(f"wrote {write_report(REPORT, report(rows, args.rounds, argv, started), wallclock=True)}")
    return 0


def served_burst(api: str, pid: int, burst: list[RequestSpec]) -> dict[str, float]:
    """One burst through the server at `api` (process `pid`): its rates and latencies, the
    load, and the CPU seconds the server and this client used over it (where /proc says)."""
    load = current_load()
    server_before, client_before = process_cpu_seconds(pid), time.process_time()
    started = time.perf_counter()
    served = run_over_http(api, served_model(api), burst, timeout=CALL_TIMEOUT_S)
    wall = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    server_after = process_cpu_seconds(pid)
    summary = run_summary(served, request_rate=math.inf)
    row = {
        "tok/s": summary["output_token_throughput"],
        "ttft p50": summary["ttft_ms"]["p50"],
        "ttft p99": summary["ttft_ms"]["p99"],
        "tpot p50": summary["tpot_ms"]["p50"],
        "load": load,
    }
    if server_before is not None and server_after is not None:
        server_cpu = server_after - server_before
        row |= {
            "server cpu": server_cpu,
            "client cpu": client_cpu,
            "idle": idle_share(server_cpu + client_cpu, wall, CORES),
        }
    return row


def report(
    rows: dict[str, list[dict[str, float]]], rounds: int, argv: Sequence[str], started: float
) -> str:
    """The medians of the rounds per way, and what they say."""

    def median(way: str, key: str) -> float:
        values = [row[key] for row in rows[way] if key in row]
        return statistics.median(values) if values else math.nan

    table = markdown_table(
        [
            [
                way,
                median(way, "tok/s"),
                median(way, "ttft p50"),
                median(way, "ttft p99"),
                median(way, "tpot p50"),
                " / ".join(f"{row['load']:.1f}" for row in rows[way]),
            ]
            for way in rows
        ],
        ["the burst", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "load per round"],
        ["", ",.0f", ".0f", ".0f", ".1f", ""],
    )
    one, two = (median(way_of(ON_A_THREAD, t), "tok/s") for t in SERVED_THREADS)
    findings = (
        f"Served at 2 threads the burst runs at {two / one:.2f}x its rate at 1 thread, and "
        f"in-process at {median(IN_PROCESS, 'tok/s') / two:.2f}x the rate served at 2 threads."
    )
    apart = way_of(IN_A_PROCESS, 1) in rows
    if apart:
        own = {t: median(way_of(IN_A_PROCESS, t), "tok/s") for t in SERVED_THREADS}
        findings += (
            f" With the engine in a process of its own the burst runs at {own[1] / one:.2f}x "
            f"the rate served with it on a thread at 1 thread, and {own[2] / two:.2f}x at 2."
        )
    peer = next((name for name in rows if name.startswith("llama-server")), None)
    if peer is not None:
        theirs = median(peer, "tok/s")
        findings += (
            f" Against {peer}: llmengine served at 1 thread {one / theirs:.2f}x, "
            f"at 2 threads {two / theirs:.2f}x"
        )
        if apart:
            findings += (
                f"; with the engine in its own process at 1 thread {own[1] / theirs:.2f}x "
                f"(TTFT p99 {median(way_of(IN_A_PROCESS, 1), 'ttft p99'):,.0f} ms against "
                f"{median(peer, 'ttft p99'):,.0f}), at 2 threads {own[2] / theirs:.2f}x"
            )
        findings += "."
        alone = way_of(LLAMA_SERVER, 1)
        if apart and alone in rows and alone != peer:
            findings += (
                f" At the same 1 thread, the engine in its own process streams "
                f"{own[1] / median(alone, 'tok/s'):.2f}x the rate of {alone}."
            )
    default = way_of(IN_A_PROCESS, forward_threads(None, CORES))
    if default in rows:
        findings += (
            f" On this machine's {CORES} cores, `llmengine serve` as it defaults is the "
            f"row {default}."
        )
    command = " ".join(["scripts/bench_http_bound.py", *map(shlex.quote, argv)])
    cpu = cpu_section(rows, median)
    return (
        "# What bounds llmengine over HTTP\n\n"
        f"The embedded model's mixed burst ({plan.HTTP_REQUESTS} requests at once, prompts "
        f"of 8-64 token ids, budgets of 8-128, greedy) on {SLOTS} slots with the decode "
        "graph: through an `Engine` in this process, and through `llmengine serve "
        "--decode-graph` with its forward on 1 and 2 torch threads (`--engine-threads`), its "
        "engine on a thread of the server's process (served, `--no-engine-process`) or in a "
        "process of its own (engine process, `serve`'s default), and through "
        "`llama-server` on the same weights in f32, as `make peers` runs it and on 1 thread, "
        "where its build is at hand. Every server is started "
        "first; each burst then runs with the others idle, through the same streaming "
        f"client. Medians of {rounds} interleaved rounds; tok/s is output tokens over the "
        "run (in-process: the whole `generate` call).\n\n"
        f"{table.rstrip()}\n\n"
        f"{findings}\n\n"
        f"{cpu}"
        f"{machine_line()}. Run in {time.perf_counter() - started:.0f} s. "
        f"Command: `{command}`.\n"
    )


def cpu_section(
    rows: dict[str, list[dict[str, float]]], median: Callable[[str, str], float]
) -> str:
    """The CPU seconds each server and the client used per burst, and the cores' idle share
    (empty where `/proc` could not say)."""
    measured = [way for way in rows if any("server cpu" in row for row in rows[way])]
    if not measured:
        return ""
    table = markdown_table(
        [
            [way, median(way, "server cpu"), median(way, "client cpu"), 100 * median(way, "idle")]
            for way in measured
        ],
        ["CPU per burst", "server CPU s", "client CPU s", "cores idle %"],
        ["", ".2f", ".2f", ".0f"],
    )
    idle = ", ".join(f"{way} {100 * median(way, 'idle'):.0f}%" for way in measured)
    return (
        f"{table.rstrip()}\n\n"
        f"CPU seconds from `/proc` over each burst, the server's threads and processes "
        f"together and the client (this process); cores idle is the share of the {CORES} "
        f"cores' time over the burst that neither used. Idle during the burst: {idle}.\n\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""`llmengine bench`: a burst through several KV pool sizes, or against a server's URL."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path

from llmengine.cli.options import (
    add_device_arguments,
    add_engine_arguments,
    add_parallel_argument,
    build_engine,
    cluster_of,
    engine_options,
    load_model,
    non_negative_int,
    positive_float,
    positive_int,
    request_rate,
)
from llmengine.engine_config import EngineConfig

DEFAULT_BENCH_TIMEOUT_S = 300.0  # most seconds one request of `bench --url` may take
URL_PROMPT_VOCAB = 1000  # `bench --url` prompt ids: below any Llama vocabulary's size


def pool_sizes(text: str) -> list[int]:
    """An argparse type: comma-separated pool sizes in blocks, e.g. 48,32,24."""
    return [positive_int(part.strip()) for part in text.split(",")]


def rates(text: str) -> list[float]:
    """An argparse type: comma-separated request rates, e.g. 1,2,4,8."""
    return [request_rate(part.strip()) for part in text.split(",")]


# Every engine knob but the pool size, which `--pools` sweeps.
ENGINE_OPTIONS = tuple(field.name for field in fields(EngineConfig) if field.name != "num_blocks")
# The flag spellings bench uses where a knob has several.
BENCH_FLAGS = {"num_slots": "--slots"}
LOCAL_BENCH_OPTIONS = ("num_slots", "block_size", "pools")
URL_BENCH_OPTIONS = (
    "url", "request_rate", "request_rates", "slo_ttft_ms", "slo_tpot_ms", "timeout", "api_key",
    "plot", "seed", "vocab_size",
)  # fmt: skip


def _flag(name: str) -> str:
    return BENCH_FLAGS.get(name, "--" + name.replace("_", "-"))


def run_bench(args: argparse.Namespace) -> int:
    """`bench` against a URL drives a server; without one it sweeps local pool sizes."""
    return _run_bench_url(args) if args.url else _run_bench_pools(args)


def _check_bench_options(
    args: argparse.Namespace, needed: Sequence[str], refused: Sequence[str]
) -> None:
    """A clear error for a bench option missing in this mode, or one that means nothing here."""
    mode = "with --url" if args.url else "without --url"
    missing = [name for name in needed if getattr(args, name) is None]
    if missing:
        flags = ", ".join(_flag(name) for name in missing)
        raise ValueError(f"{flags} required {mode}")
    # An option left out is None, a flag (`store_true`) left out is False: compared by
    # identity, so that a number given as 0 still counts as given.
    given = [
        name
        for name in refused
        if (value := getattr(args, name)) is not None and value is not False
    ]
    if given:
        flags = ", ".join(_flag(name) for name in given)
        raise ValueError(f"{flags} not used {mode}")


def _run_bench_pools(args: argparse.Namespace) -> int:
    """Run the uniform burst through one engine per pool size and print one row per pool."""
    import json

    from llmengine.bench.batchbench import DivergentOutputError, sweep_pool_sizes
    from llmengine.bench.report import format_csv, format_table, sweep_summary
    from llmengine.bench.workloads import uniform_burst
    from llmengine.model.config import LlamaConfig
    from llmengine.model.loader import model_folder

    _check_bench_options(args, LOCAL_BENCH_OPTIONS, URL_BENCH_OPTIONS)
    # Validated once, before the model loads: every pool gets the same knobs.
    config = EngineConfig(num_blocks=max(args.pools), **engine_options(args, ENGINE_OPTIONS))
    path = None if args.model is None else Path(args.model)
    ranks = args.tensor_parallel_size or 1
    if ranks > 1 and cluster_of(args).nnodes > 1:
        raise ValueError("bench runs its ranks on one machine: --nnodes is for generate and serve")
    model = load_model(args, path) if ranks == 1 else None
    vocab_size = LlamaConfig.from_file(model_folder(path) / "config.json").vocab_size
    workload = uniform_burst(args.requests, args.prompt_len, args.max_tokens, vocab_size=vocab_size)
    options = {name: getattr(config, name) for name in ENGINE_OPTIONS}
    engines = partial(build_engine, args, model)  # one engine per pool, on 1 or more ranks
    try:
        results = sweep_pool_sizes(
            engines, workload, args.pools, progress=sys.stderr.isatty(), **options
        )
    except DivergentOutputError as error:
        print(f"llmengine bench: the pools disagree, an engine bug: {error}", file=sys.stderr)
        return 1
    summaries = sweep_summary(results)
    if args.format == "json":
        print(json.dumps(summaries, indent=2))
    elif args.format == "csv":
        print(format_csv(summaries), end="")
    else:
        swap = f", swap ({config.swap_blocks} host blocks)" if config.preemption == "swap" else ""
        print(
            f"{args.requests} requests arriving together, {args.prompt_len}-token prompts, "
            f"{args.max_tokens} tokens each; {config.num_slots} slots, block size "
            f"{config.block_size}, policy {config.policy}{swap}; latencies in iterations"
        )
        print(format_table(summaries))
    return 0


def _run_bench_url(args: argparse.Namespace) -> int:
    """Stream the uniform burst from a server, at each offered rate, and print the latencies.

    Exit status 1 when any request failed (the report, with the reasons, is printed anyway).
    """
    import json
    import os

    from llmengine.bench.http_client import run_over_http, served_model
    from llmengine.bench.serving_report import (
        format_run_csv,
        format_run_table,
        plot_latency_throughput,
        run_summary,
    )
    from llmengine.bench.workloads import poisson_arrivals, uniform_burst

    local_only = [
        *LOCAL_BENCH_OPTIONS,
        *ENGINE_OPTIONS,
        "device",
        "dtype",
        "kernels",
        "quantization",
    ]
    _check_bench_options(args, (), local_only)
    if args.request_rate is not None and args.request_rates is not None:
        raise ValueError("give --request-rate or --request-rates, not both")
    timeout = args.timeout or DEFAULT_BENCH_TIMEOUT_S
    seed = args.seed or 0
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    model = args.model or served_model(args.url, timeout=timeout, api_key=api_key)
    sweep = args.request_rates is not None
    rates = args.request_rates if sweep else [args.request_rate or math.inf]
    burst = uniform_burst(
        args.requests,
        args.prompt_len,
        args.max_tokens,
        vocab_size=args.vocab_size or URL_PROMPT_VOCAB,
        seed=seed,
    )
    summaries = []
    for rate in rates:
        workload = burst if math.isinf(rate) else poisson_arrivals(burst, rate, seed=seed)
        run = run_over_http(
            args.url, model, workload, timeout=timeout, api_key=api_key,
            progress=sys.stderr.isatty(),
        )  # fmt: skip
        summaries.append(
            run_summary(
                run, request_rate=rate, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms
            )
        )
    if args.plot is not None:
        plot_latency_throughput(summaries, args.plot)
    if args.format == "json":
        print(json.dumps(summaries if sweep else summaries[0], indent=2))
    elif args.format == "csv":
        print(format_run_csv(summaries), end="")
    else:
        burst_only = all(math.isinf(rate) for rate in rates)
        arrivals = "arriving together" if burst_only else "Poisson arrivals"
        print(
            f"{args.url}, model {model}: {args.requests} requests, {arrivals}, "
            f"{args.prompt_len}-token prompts, {args.max_tokens} tokens each; latencies in ms"
        )
        print(format_run_table(summaries))
    return 1 if any(summary["failed"] for summary in summaries) else 0


def add_bench(subparsers: argparse._SubParsersAction) -> None:
    """`llmengine bench`: a burst through several KV pool sizes, or against a server's URL."""
    parser = subparsers.add_parser(
        "bench",
        help="run a burst of requests through several pool sizes, or against a server",
        description="Without --url: run N requests arriving together (greedy, no early stop) "
        "through one engine per pool size and print occupancy, preemptions and the recompute "
        "bill. With --url: stream the same requests from an OpenAI-compatible server, all at "
        "once or as Poisson arrivals, and print latency percentiles and throughput.",
    )
    parser.add_argument("--requests", type=positive_int, required=True, metavar="N")
    parser.add_argument(
        "--prompt-len", type=positive_int, required=True, metavar="P", help="tokens per prompt"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, required=True, metavar="T",
        help="tokens each request generates",
    )  # fmt: skip
    parser.add_argument(
        "--model", default=None, metavar="DIR|NAME",
        help="without --url: the checkpoint folder (default: the embedded model); with --url: "
        "the model name to ask for (default: the first one the server lists)",
    )  # fmt: skip
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    local = parser.add_argument_group("a local pool sweep (without --url)")
    local.add_argument(
        "--pools", type=pool_sizes, default=None, metavar="48,32,24",
        help="pool sizes in blocks, comma-separated",
    )  # fmt: skip
    add_engine_arguments(local, ENGINE_OPTIONS, flags=BENCH_FLAGS, unset=True)
    add_device_arguments(local)
    add_parallel_argument(local, unset=True)
    remote = parser.add_argument_group("a server (with --url)")
    remote.add_argument(
        "--url", default=None, metavar="http://HOST:PORT/v1",
        help="an OpenAI-compatible server's API root",
    )  # fmt: skip
    remote.add_argument(
        "--request-rate", type=request_rate, default=None, metavar="R",
        help="Poisson arrivals at R requests/s (default: all at once)",
    )  # fmt: skip
    remote.add_argument(
        "--request-rates", type=rates, default=None, metavar="1,2,4,8",
        help="one run per rate: the latency-throughput curve",
    )  # fmt: skip
    remote.add_argument(
        "--seed", type=non_negative_int, default=None, metavar="S",
        help="seed of the prompts and of the arrival times (default 0)",
    )  # fmt: skip
    remote.add_argument(
        "--vocab-size", type=positive_int, default=None, metavar="V",
        help=f"prompt token ids are drawn below V (default {URL_PROMPT_VOCAB}: ids every "
        "Llama tokenizer has)",
    )  # fmt: skip
    remote.add_argument(
        "--slo-ttft-ms", type=positive_float, default=None, metavar="MS",
        help="goodput counts requests whose first token came within MS",
    )  # fmt: skip
    remote.add_argument(
        "--slo-tpot-ms", type=positive_float, default=None, metavar="MS",
        help="goodput counts requests whose time per output token is within MS",
    )  # fmt: skip
    remote.add_argument(
        "--timeout", type=positive_float, default=None, metavar="S",
        help="most seconds one request may take, and any connect or read "
        f"(default {DEFAULT_BENCH_TIMEOUT_S:g})",
    )  # fmt: skip
    remote.add_argument(
        "--api-key", default=None, metavar="KEY",
        help="sent as `Authorization: Bearer KEY` (default: $OPENAI_API_KEY, or none)",
    )  # fmt: skip
    remote.add_argument(
        "--plot", type=Path, default=None, metavar="FILE",
        help="draw the latency-throughput curve to FILE (needs matplotlib)",
    )  # fmt: skip
    parser.set_defaults(handler=run_bench)

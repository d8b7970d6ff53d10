"""The `llmengine` command line: one argparse subcommand per verb.

Each subcommand is a function that adds its parser to the subparsers and sets `handler`
(a callable taking the parsed arguments and returning an exit code). Adding a verb is one
such function appended to `SUBCOMMANDS`. Errors a user can cause (bad numbers, a folder
that is not a checkpoint) surface as `ValueError` or `OSError` and are printed as one line
with exit status 2, never as a traceback. What only some subcommands need (the engine, the
bench layer) is imported inside their handlers, so that `--help` and errors stay quick.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llmengine.config import DTYPES
from llmengine.projections import PREPARATIONS
from llmengine.quantization import QUANTIZATIONS
from llmengine.sampling import SamplingParams
from llmengine.scheduler import POLICIES, PREEMPTION_MODES

if TYPE_CHECKING:
    from llmengine.model import Llama

Subparsers = argparse._SubParsersAction  # argparse exposes no public name for this type
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a filter cut off
BLOCK_SIZE = 16  # tokens per KV block for `generate`: the engine's default
DEFAULT_BENCH_TIMEOUT_S = 300.0  # most seconds one request of `bench --url` may take
URL_PROMPT_VOCAB = 1000  # `bench --url` prompt ids: below any Llama vocabulary's size


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """`--model DIR`, the checkpoint every subcommand that runs a model accepts."""
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        metavar="DIR",
        help="checkpoint folder (Hugging Face Llama layout); default: the embedded model",
    )


def add_device_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--device`, `--dtype`, `--kernels` and `--quantization`: where the model and its KV cache
    live, in what precision, and how its matrix products are computed.

    All default to None (the CPU, float32, kernels measured, no quantization), so a mode that
    has no model can refuse them. A device this machine lacks is refused by `load_model`, as
    a one-line error.
    """
    parser.add_argument(
        "--device", default=None, metavar="DEVICE",
        help="where the weights and the KV cache live: cpu (default), cuda or cuda:N",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=(*DTYPES, "auto"), default=None,
        help="weights and KV cache precision (default float32; auto: the checkpoint's own)",
    )  # fmt: skip
    parser.add_argument(
        "--kernels", choices=PREPARATIONS, default=None,
        help="matrix-product kernels: measured at load on this machine (default), "
        "packed (MKL's packed copy for 4-48 rows) or eager (F.linear)",
    )  # fmt: skip
    parser.add_argument(
        "--quantization", choices=("none", *QUANTIZATIONS), default=None,
        help="int8: store the weights as int8, one scale per output channel (CPU only); "
        "none (default): in --dtype",
    )  # fmt: skip


def add_decode_graph_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--decode-graph`: compile the decode step once per batch bucket (llmengine.decode_graph)."""
    parser.add_argument(
        "--decode-graph", action="store_true",
        help="compile the whole decode step once per batch bucket at start-up (inductor, frozen "
        "weights); decode-only steps run the graph, the rest eager",
    )  # fmt: skip


def _load_model(args: argparse.Namespace, path: Path | None) -> Llama:
    """The checkpoint at `path` on the `--device` and in the `--dtype` the command was given."""
    import llmengine

    return llmengine.load_model(
        path,
        device=args.device or "cpu",
        dtype=args.dtype,
        kernels=args.kernels or "measured",
        quantization=None if args.quantization == "none" else args.quantization,
    )


def _run_generate(args: argparse.Namespace) -> int:
    """Complete one prompt through the engine, printing the text as the tokens arrive.

    stdout gets only the completion (then a newline), so it can be piped; a summary of the
    generation (tokens, seconds from the request to its last token, tokens/s) goes to stderr.
    """
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    import llmengine
    from llmengine.detokenizer import IncrementalDecoder

    model = _load_model(args, args.model)
    tokenizer = llmengine.load_tokenizer(args.model)
    prompt_ids = tokenizer.encode(args.prompt)
    # One request alone: a pool that holds its worst case, so it is never preempted.
    num_blocks = llmengine.blocks_for_length(len(prompt_ids) + params.max_tokens, BLOCK_SIZE)
    engine = llmengine.Engine(
        model,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        num_slots=1,
        decode_graph=args.decode_graph,
    )
    start = time.perf_counter()
    request_id = engine.add_request(prompt_ids, params)
    decoder = IncrementalDecoder(tokenizer)
    num_tokens = 0
    while engine.has_unfinished():
        outcome = engine.step()
        if request_id in outcome.tokens:
            num_tokens += 1
            _print_now(decoder.add(outcome.tokens[request_id]))
    elapsed = time.perf_counter() - start
    _print_now(decoder.finish() + "\n")
    print(
        f"llmengine generate: {num_tokens} tokens in {elapsed:.2f} s "
        f"({num_tokens / elapsed:.0f} tokens/s)",
        file=sys.stderr,
    )
    return 0


def _print_now(text: str) -> None:
    """Write to stdout and flush, so that a reader sees each piece as it is generated."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def add_generate(subparsers: Subparsers) -> None:
    """`llmengine generate`: complete one prompt through the engine, streaming the text."""
    defaults = SamplingParams()
    parser = subparsers.add_parser(
        "generate",
        help="complete one prompt",
        description="Complete one prompt, printing the text as it is generated; "
        "a summary (tokens, tokens/s) goes to stderr.",
    )
    add_model_argument(parser)
    add_device_arguments(parser)
    add_decode_graph_argument(parser)
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        metavar="N",
        help=f"most tokens to generate (default {defaults.max_tokens})",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        metavar="T",
        help="0 is greedy (default)",
    )
    parser.add_argument(
        "--top-k", type=int, default=defaults.top_k, metavar="K", help="0 keeps all tokens"
    )
    parser.add_argument(
        "--top-p", type=float, default=defaults.top_p, metavar="P", help="nucleus mass, in (0, 1]"
    )
    parser.add_argument(
        "--seed", type=int, default=None, metavar="S", help="reproducible sampling with this seed"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens"
    )
    parser.set_defaults(handler=_run_generate)


def _number_type(
    convert: Callable[[str], float], expected: str, valid: Callable[[float], bool], rule: str
) -> Callable[[str], float]:
    """An argparse type: `convert` the text, then refuse a value that is not `valid`."""

    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


_positive_int = _number_type(int, "a whole number", lambda value: value >= 1, "at least 1")
_non_negative_int = _number_type(int, "a whole number", lambda value: value >= 0, "at least 0")
# Requests per second: a positive number, or `inf` for all at once.
_rate = _number_type(float, "requests per second", lambda value: value > 0, "positive")
_positive_float = _number_type(
    float, "a number", lambda value: 0 < value < math.inf, "a positive number"
)
_non_negative_float = _number_type(
    float, "a number", lambda value: 0 <= value < math.inf, "a number >= 0"
)


def _origins(text: str) -> list[str]:
    """An argparse type: comma-separated web origins, e.g. https://a.example,https://b.example."""
    origins = [origin.strip() for origin in text.split(",") if origin.strip()]
    if not origins:
        raise argparse.ArgumentTypeError(f"expected one or more origins, got {text!r}")
    return origins


def _pool_sizes(text: str) -> list[int]:
    """An argparse type: comma-separated pool sizes in blocks, e.g. 48,32,24."""
    return [_positive_int(part.strip()) for part in text.split(",")]


def _rates(text: str) -> list[float]:
    """An argparse type: comma-separated request rates, e.g. 1,2,4,8."""
    return [_rate(part.strip()) for part in text.split(",")]


LOCAL_BENCH_OPTIONS = ("slots", "block_size", "pools")
URL_BENCH_OPTIONS = (
    "url", "request_rate", "request_rates", "slo_ttft_ms", "slo_tpot_ms", "timeout", "api_key",
    "plot", "seed", "vocab_size",
)  # fmt: skip


def _run_bench(args: argparse.Namespace) -> int:
    """`bench` against a URL drives a server; without one it sweeps local pool sizes."""
    return _run_bench_url(args) if args.url else _run_bench_pools(args)


def _check_bench_options(
    args: argparse.Namespace, needed: Sequence[str], refused: Sequence[str]
) -> None:
    """A clear error for a bench option missing in this mode, or one that means nothing here."""
    mode = "with --url" if args.url else "without --url"
    missing = [name for name in needed if getattr(args, name) is None]
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise ValueError(f"{flags} required {mode}")
    # An option left out is None, a flag (`store_true`) left out is False: compared by
    # identity, so that a number given as 0 still counts as given.
    given = [
        name
        for name in refused
        if (value := getattr(args, name)) is not None and value is not False
    ]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags} not used {mode}")


def _run_bench_pools(args: argparse.Namespace) -> int:
    """Run the uniform burst through one engine per pool size and print one row per pool."""
    import json

    from llmengine.bench.batchbench import DivergentOutputError, sweep_pool_sizes
    from llmengine.bench.report import format_csv, format_table, sweep_summary
    from llmengine.bench.workloads import uniform_burst

    _check_bench_options(args, LOCAL_BENCH_OPTIONS, URL_BENCH_OPTIONS)
    policy = args.policy or "incremental"
    preemption = args.preemption or "recompute"
    swap_blocks = args.swap_blocks or 0
    model = _load_model(args, None if args.model is None else Path(args.model))
    workload = uniform_burst(
        args.requests, args.prompt_len, args.max_tokens, vocab_size=model.config.vocab_size
    )
    try:
        results = sweep_pool_sizes(
            model,
            workload,
            args.pools,
            block_size=args.block_size,
            num_slots=args.slots,
            policy=policy,
            preemption=preemption,
            swap_blocks=swap_blocks,
            decode_graph=args.decode_graph,
            progress=sys.stderr.isatty(),
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
        swap = f", swap ({swap_blocks} host blocks)" if preemption == "swap" else ""
        print(
            f"{args.requests} requests arriving together, {args.prompt_len}-token prompts, "
            f"{args.max_tokens} tokens each; {args.slots} slots, block size {args.block_size}, "
            f"policy {policy}{swap}; latencies in iterations"
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
        "policy",
        "preemption",
        "swap_blocks",
        "device",
        "dtype",
        "kernels",
        "quantization",
        "decode_graph",
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


def add_bench(subparsers: Subparsers) -> None:
    """`llmengine bench`: a burst through several KV pool sizes, or against a server's URL."""
    parser = subparsers.add_parser(
        "bench",
        help="run a burst of requests through several pool sizes, or against a server",
        description="Without --url: run N requests arriving together (greedy, no early stop) "
        "through one engine per pool size and print occupancy, preemptions and the recompute "
        "bill. With --url: stream the same requests from an OpenAI-compatible server, all at "
        "once or as Poisson arrivals, and print latency percentiles and throughput.",
    )
    parser.add_argument("--requests", type=_positive_int, required=True, metavar="N")
    parser.add_argument(
        "--prompt-len", type=_positive_int, required=True, metavar="P", help="tokens per prompt"
    )
    parser.add_argument(
        "--max-tokens", type=_positive_int, required=True, metavar="T",
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
        "--slots", type=_positive_int, default=None, metavar="S",
        help="most requests in one forward",
    )  # fmt: skip
    local.add_argument(
        "--block-size", type=_positive_int, default=None, metavar="B", help="tokens per block"
    )
    local.add_argument(
        "--pools", type=_pool_sizes, default=None, metavar="48,32,24",
        help="pool sizes in blocks, comma-separated",
    )  # fmt: skip
    local.add_argument(
        "--policy", choices=POLICIES, default=None,
        help="how blocks are bought (default incremental)",
    )  # fmt: skip
    local.add_argument(
        "--preemption", choices=PREEMPTION_MODES, default=None,
        help="what evicting a request does with its K/V: throw it away (default), or copy it "
        "to host memory",
    )  # fmt: skip
    local.add_argument(
        "--swap-blocks", type=_non_negative_int, default=None, metavar="N",
        help="host blocks for swapped-out K/V (with --preemption swap; default 0)",
    )  # fmt: skip
    add_device_arguments(local)
    add_decode_graph_argument(local)
    remote = parser.add_argument_group("a server (with --url)")
    remote.add_argument(
        "--url", default=None, metavar="http://HOST:PORT/v1",
        help="an OpenAI-compatible server's API root",
    )  # fmt: skip
    remote.add_argument(
        "--request-rate", type=_rate, default=None, metavar="R",
        help="Poisson arrivals at R requests/s (default: all at once)",
    )  # fmt: skip
    remote.add_argument(
        "--request-rates", type=_rates, default=None, metavar="1,2,4,8",
        help="one run per rate: the latency-throughput curve",
    )  # fmt: skip
    remote.add_argument(
        "--seed", type=_non_negative_int, default=None, metavar="S",
        help="seed of the prompts and of the arrival times (default 0)",
    )  # fmt: skip
    remote.add_argument(
        "--vocab-size", type=_positive_int, default=None, metavar="V",
        help=f"prompt token ids are drawn below V (default {URL_PROMPT_VOCAB}: ids every "
        "Llama tokenizer has)",
    )  # fmt: skip
    remote.add_argument(
        "--slo-ttft-ms", type=_positive_float, default=None, metavar="MS",
        help="goodput counts requests whose first token came within MS",
    )  # fmt: skip
    remote.add_argument(
        "--slo-tpot-ms", type=_positive_float, default=None, metavar="MS",
        help="goodput counts requests whose time per output token is within MS",
    )  # fmt: skip
    remote.add_argument(
        "--timeout", type=_positive_float, default=None, metavar="S",
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
    parser.set_defaults(handler=_run_bench)


def _run_serve(args: argparse.Namespace) -> int:
    """Serve the model over the OpenAI API until SIGINT or SIGTERM."""
    import os

    import llmengine
    from llmengine.loader import model_folder
    from llmengine.server import create_app, serve
    from llmengine.server.chat import chat_template_of

    api_key = _api_key(args.api_key, os.environ.get("LLMENGINE_API_KEY"))  # before the load
    folder = model_folder(args.model)
    tokenizer = llmengine.load_tokenizer(args.model)
    engine = llmengine.Engine(
        _load_model(args, args.model),
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        num_slots=args.max_num_seqs,
        policy=args.policy,
        preemption=args.preemption,
        swap_blocks=args.swap_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        compile=args.compile,
        decode_graph=args.decode_graph,
        tokenizer=tokenizer,
    )
    app = create_app(
        engine,
        tokenizer,
        served_model_name=args.served_model_name or folder.name,
        api_key=api_key,
        max_waiting=args.max_waiting,
        chat_template=chat_template_of(folder, tokenizer),
        allowed_origins=args.allowed_origins,
    )
    return serve(app, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout)


def _api_key(given: str | None, from_environment: str | None) -> str | None:
    """The key `serve` requires: the option's, else the environment's, else none. An empty
    or blank key is refused, not read as "no key": that would open a server its operator
    meant to close."""
    for source, key in (("--api-key", given), ("LLMENGINE_API_KEY", from_environment)):
        if key is not None:
            if not key.strip():
                raise ValueError(f"{source} is empty; leave it out to serve without a key")
            return key
    return None


def add_serve(subparsers: Subparsers) -> None:
    """`llmengine serve`: an OpenAI-compatible HTTP server in front of one engine."""
    from llmengine.server.app import MAX_WAITING
    from llmengine.server.runner import SHUTDOWN_TIMEOUT

    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI API over HTTP",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
        "/metrics from one engine, until SIGINT or SIGTERM.",
    )
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_non_negative_int, default=8000, help="default 8000")
    parser.add_argument(
        "--served-model-name", default=None, metavar="NAME",
        help="the model name clients ask for (default: the checkpoint folder's name)",
    )  # fmt: skip
    parser.add_argument(
        "--num-blocks", type=_positive_int, default=256, metavar="N",
        help="KV blocks in the pool (default 256)",
    )  # fmt: skip
    parser.add_argument(
        "--block-size", type=_positive_int, default=BLOCK_SIZE, metavar="B",
        help=f"tokens per block (default {BLOCK_SIZE})",
    )  # fmt: skip
    parser.add_argument(
        "--max-num-seqs", type=_positive_int, default=8, metavar="S",
        help="most requests in one forward (default 8)",
    )  # fmt: skip
    parser.add_argument("--policy", choices=POLICIES, default=POLICIES[0])
    parser.add_argument("--preemption", choices=PREEMPTION_MODES, default=PREEMPTION_MODES[0])
    parser.add_argument(
        "--swap-blocks", type=_non_negative_int, default=0, metavar="N",
        help="host blocks for swapped-out K/V (with --preemption swap; default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--max-num-batched-tokens", type=_positive_int, default=None, metavar="N",
        help="most positions one forward computes, at least --max-num-seqs; a longer prompt "
        "is prefilled over several steps (default: no cap)",
    )  # fmt: skip
    parser.add_argument(
        "--enable-prefix-caching", action="store_true",
        help="share the K/V blocks of equal prompt prefixes between requests",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="compile each layer's position-wise halves with torch.compile at start-up "
        "(lesson 23; on a CPU it costs seconds and buys little)",
    )  # fmt: skip
    add_decode_graph_argument(parser)
    parser.add_argument(
        "--max-waiting", type=_positive_int, default=MAX_WAITING, metavar="W",
        help="most requests left waiting for a slot (each of a request's n choices counts) "
        "once the free ones are taken; beyond it HTTP 429 with Retry-After. Size it as the "
        "most clients you expect at once minus --max-num-seqs; a waiting request holds only "
        f"its prompt (default {MAX_WAITING})",
    )  # fmt: skip
    parser.add_argument(
        "--api-key", default=None, metavar="KEY",
        help="require `Authorization: Bearer KEY` on /v1. Prefer $LLMENGINE_API_KEY: a key "
        "on the command line is visible to every user in the process list (default: "
        "$LLMENGINE_API_KEY, or no key)",
    )  # fmt: skip
    parser.add_argument(
        "--allowed-origins", type=_origins, action="extend", default=[], metavar="ORIGINS",
        help="comma-separated web origins (https://example.org, or *) whose pages may call "
        "the API from a browser (CORS); none by default",
    )  # fmt: skip
    parser.add_argument(
        "--shutdown-timeout", type=_non_negative_float, default=SHUTDOWN_TIMEOUT, metavar="S",
        help="on SIGTERM or SIGINT, stop admitting (503) and give the requests in flight up "
        f"to S seconds to finish before ending them with an error (default {SHUTDOWN_TIMEOUT:g})",
    )  # fmt: skip
    parser.set_defaults(handler=_run_serve)


SUBCOMMANDS: list[Callable[[Subparsers], None]] = [add_generate, add_bench, add_serve]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand in `SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="llmengine", description="An LLM inference engine built from scratch."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_subcommand in SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments), run the subcommand, return its status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader of stdout went away (`| head`): stop quietly, as a Unix filter does.
        return EXIT_BROKEN_PIPE
    except (ValueError, OSError) as error:
        print(f"llmengine {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130

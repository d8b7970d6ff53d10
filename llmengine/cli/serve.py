"""`llmengine serve`: an OpenAI-compatible HTTP server in front of one engine."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmengine.cli.options import (
    add_device_arguments,
    add_engine_arguments,
    add_model_argument,
    add_parallel_argument,
    build_engine,
    engine_options,
    is_worker_node,
    load_model,
    non_negative_float,
    non_negative_int,
    positive_int,
    run_worker_node,
)
from llmengine.engine_config import EngineConfig

if TYPE_CHECKING:
    from llmengine.engine import Engine
    from llmengine.server.engine_process import EngineProcess

ENGINE_OPTIONS = tuple(field.name for field in fields(EngineConfig))
NUM_BLOCKS = 256  # the pool `serve` starts with when --num-blocks is not given
SERVE_FLAGS = {"num_slots": "--max-num-seqs"}  # vLLM's spelling, where a knob has several


def origins(text: str) -> list[str]:
    """An argparse type: comma-separated web origins, e.g. https://a.example,https://b.example."""
    found = [origin.strip() for origin in text.split(",") if origin.strip()]
    if not found:
        raise argparse.ArgumentTypeError(f"expected one or more origins, got {text!r}")
    return found


def run_serve(args: argparse.Namespace) -> int:
    """Serve the model over the OpenAI API until SIGINT or SIGTERM."""
    import os

    import llmengine
    from llmengine.model.loader import model_folder

    api_key = _api_key(args.api_key, os.environ.get("LLMENGINE_API_KEY"))  # before the load
    folder = model_folder(args.model)
    if is_worker_node(args):  # another machine's share of the ranks: no engine, no server here
        return worker_node(args)
    tokenizer = llmengine.load_tokenizer(args.model)
    if args.engine_process:
        from llmengine.server.engine_process import EngineProcess

        engine: Engine | EngineProcess = EngineProcess(partial(engine_for, args))
    else:
        engine = engine_for(args, tokenizer)
    with contextlib.closing(engine):
        return _serve(args, engine, tokenizer, folder, api_key)


def engine_for(args: argparse.Namespace, tokenizer: Any = None) -> Engine:
    """The engine `serve`'s options describe, its forward on `--engine-threads` (built in the
    engine's own process unless --no-engine-process: there the tokenizer is loaded again)."""
    import torch

    import llmengine

    threads = forward_threads(args.engine_threads, torch.get_num_threads())
    torch.set_num_threads(threads)  # before the build: the decode graphs compile for it
    print(f"llmengine: the engine's forward runs on {threads} torch thread(s)", file=sys.stderr)
    model = load_model(args, args.model) if args.tensor_parallel_size == 1 else None
    if tokenizer is None:
        tokenizer = llmengine.load_tokenizer(args.model)
    options = engine_options(args, ENGINE_OPTIONS)
    return build_engine(args, model, tokenizer=tokenizer, **options)


def worker_node(args: argparse.Namespace) -> int:
    """This machine's ranks of node 0's engine, until node 0 stops them. No HTTP side shares
    this machine, so their forward takes all of the process's threads unless
    `--engine-threads` names a count; each rank takes the count this process has."""
    import torch

    if args.engine_threads is not None:
        torch.set_num_threads(args.engine_threads)
    threads = torch.get_num_threads()
    print(
        f"llmengine: this node's ranks run their forward on {threads} torch thread(s)",
        file=sys.stderr,
    )
    return run_worker_node(args, **engine_options(args, ENGINE_OPTIONS))


def forward_threads(requested: int | None, available: int) -> int:
    """The torch threads of the engine's forward: `requested`, else all of the process's
    `available` threads but one, so that the HTTP side (and the client, on the same machine)
    has a core the forward's threads never wait for. On 2-core machines a forward on both
    cores served a burst slower than one on a single thread, in a process of its own or
    not (reports/wallclock/http-bound.md)."""
    return requested if requested is not None else max(available - 1, 1)


def _serve(
    args: argparse.Namespace,
    engine: Engine | EngineProcess,
    tokenizer: Any,
    folder: Path,
    api_key: str | None,
) -> int:
    """The OpenAI API in front of `engine` until SIGINT or SIGTERM; its exit status."""
    from llmengine.server import create_app, serve
    from llmengine.server.chat import chat_template_of

    app = create_app(
        engine,
        tokenizer,
        served_model_name=args.served_model_name or folder.name,
        api_key=api_key,
        max_waiting=args.max_waiting,
        chat_template=chat_template_of(folder, tokenizer),
        allowed_origins=args.allowed_origins,
        tool_call_parser=args.tool_call_parser,
        dashboard=args.dashboard,
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


def add_serve(subparsers: argparse._SubParsersAction) -> None:
    """`llmengine serve`: an OpenAI-compatible HTTP server in front of one engine."""
    from llmengine.server.app import MAX_WAITING
    from llmengine.server.runner import SHUTDOWN_TIMEOUT
    from llmengine.server.tool_parsers import TOOL_CALL_PARSERS

    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI API over HTTP",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
        "/metrics from one engine, until SIGINT or SIGTERM.",
    )
    add_model_argument(parser)
    add_device_arguments(parser)
    add_parallel_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=non_negative_int, default=8000, help="default 8000")
    parser.add_argument(
        "--served-model-name", default=None, metavar="NAME",
        help="the model name clients ask for (default: the checkpoint folder's name)",
    )  # fmt: skip
    add_engine_arguments(
        parser, ENGINE_OPTIONS, defaults={"num_blocks": NUM_BLOCKS}, flags=SERVE_FLAGS
    )
    parser.add_argument(
        "--max-waiting", type=positive_int, default=MAX_WAITING, metavar="W",
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
        "--allowed-origins", type=origins, action="extend", default=[], metavar="ORIGINS",
        help="comma-separated web origins (https://example.org, or *) whose pages may call "
        "the API from a browser (CORS); none by default",
    )  # fmt: skip
    parser.add_argument(
        "--tool-call-parser", choices=sorted(TOOL_CALL_PARSERS), default=None, metavar="NAME",
        help="read the model's own tool calls from tool_choice \"auto\" outputs, in this "
        "format: hermes (<tool_call> tags) or llama3_json (Llama 3.x JSON calls); without it "
        "such outputs are returned as text (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--engine-process", action=argparse.BooleanOptionalAction, default=True,
        help="run the engine in a process of its own, beside the HTTP server's, so that the "
        "two never wait for each other's interpreter lock (reports/wallclock/http-bound.md); "
        "--no-engine-process runs it on a thread of the server's process (default: its own)",
    )  # fmt: skip
    parser.add_argument(
        "--engine-threads", type=positive_int, default=None, metavar="N",
        help="torch threads of the engine's forward (default: the process's threads, "
        "$OMP_NUM_THREADS or the cores, but one, and at least 1: the HTTP side keeps a core; "
        "on a node of rank above 0, which serves no HTTP, all of them)",
    )  # fmt: skip
    parser.add_argument(
        "--no-dashboard", dest="dashboard", action="store_false",
        help="serve neither the live page /dashboard nor its feed /v1/engine/events",
    )  # fmt: skip
    parser.add_argument(
        "--shutdown-timeout", type=non_negative_float, default=SHUTDOWN_TIMEOUT, metavar="S",
        help="on SIGTERM or SIGINT, stop admitting (503) and give the requests in flight up "
        f"to S seconds to finish before ending them with an error (default {SHUTDOWN_TIMEOUT:g})",
    )  # fmt: skip
    parser.set_defaults(handler=run_serve)

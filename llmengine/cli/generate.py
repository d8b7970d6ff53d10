"""`llmengine generate`: complete one prompt through the engine, streaming the text."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from llmengine.cli.options import (
    add_device_arguments,
    add_engine_arguments,
    add_model_argument,
    add_parallel_argument,
    build_engine,
    engine_options,
    is_worker_node,
    load_model,
    run_worker_node,
)
from llmengine.sampling import SamplingParams
from llmengine.structured.constraint import Constraint

# The engine options `generate` offers: one request alone needs no pool or policy knobs.
ENGINE_OPTIONS = ("block_size", "compile", "decode_graph", "speculative", "num_speculative_tokens")


def run_generate(args: argparse.Namespace) -> int:
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
        constraint=constraint_of(args),
    )
    import llmengine

    # The checkpoint before its tokenizer, so a folder that is not one is reported as such.
    model = load_model(args, args.model) if args.tensor_parallel_size == 1 else None
    tokenizer = llmengine.load_tokenizer(args.model)
    prompt_ids = tokenizer.encode(args.prompt)
    options = engine_options(args, ENGINE_OPTIONS)
    # One request alone: a pool that holds its worst case, so it is never preempted.
    options["num_blocks"] = llmengine.blocks_for_length(
        len(prompt_ids) + params.max_tokens, options["block_size"]
    )
    if is_worker_node(args):  # another machine's share of the ranks: no engine here
        return run_worker_node(args, num_slots=1, **options)
    with contextlib.closing(build_engine(args, model, num_slots=1, **options)) as engine:
        engine.tokenizer = tokenizer
        return stream_completion(engine, tokenizer, prompt_ids, params)


def constraint_of(args: argparse.Namespace) -> Constraint | None:
    """The output constraint the flags ask for, if any (at most one: argparse sees to it)."""
    if args.json_schema is not None:
        return Constraint.json_schema(text_or_file(args.json_schema))
    if args.json_object:
        return Constraint.json_object()
    if args.regex is not None:
        return Constraint.regex(args.regex)
    if args.choice is not None:
        return Constraint.choice(args.choice)
    if args.grammar is not None:
        return Constraint.grammar(text_or_file(args.grammar))
    return None


def text_or_file(value: str) -> str:
    """A flag's text, or with a leading @ the text of the file it names (curl's convention)."""
    return Path(value[1:]).read_text() if value.startswith("@") else value


def stream_completion(
    engine: Any, tokenizer: Any, prompt_ids: list[int], params: SamplingParams
) -> int:
    """Step `engine` until the one request ends, printing each piece of text as it comes."""
    from llmengine.model.detokenizer import IncrementalDecoder

    start = time.perf_counter()
    request_id = engine.add_request(prompt_ids, params)
    decoder = IncrementalDecoder(tokenizer)
    num_tokens = 0
    while engine.has_unfinished():
        outcome = engine.step()
        for token in outcome.new_tokens(request_id):
            num_tokens += 1
            print_now(decoder.add(token))
    elapsed = time.perf_counter() - start
    print_now(decoder.finish() + "\n")
    print(
        f"llmengine generate: {num_tokens} tokens in {elapsed:.2f} s "
        f"({num_tokens / elapsed:.0f} tokens/s)",
        file=sys.stderr,
    )
    return 0


def print_now(text: str) -> None:
    """Write to stdout and flush, so that a reader sees each piece as it is generated."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def add_generate(subparsers: argparse._SubParsersAction) -> None:
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
    add_engine_arguments(parser, ENGINE_OPTIONS)
    add_parallel_argument(parser)
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    parser.add_argument(
        "--max-tokens", type=int, default=defaults.max_tokens, metavar="N",
        help=f"most tokens to generate (default {defaults.max_tokens})",
    )  # fmt: skip
    parser.add_argument(
        "--temperature", type=float, default=defaults.temperature, metavar="T",
        help="0 is greedy (default)",
    )  # fmt: skip
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
    constrained = parser.add_argument_group("output constraint (at most one)")
    constraint = constrained.add_mutually_exclusive_group()
    constraint.add_argument(
        "--json-schema", metavar="SCHEMA", help="JSON the schema validates (the schema, or @FILE)"
    )
    constraint.add_argument("--json-object", action="store_true", help="any JSON object")
    constraint.add_argument(
        "--regex", metavar="PATTERN", help="text the whole regular expression matches"
    )
    constraint.add_argument(
        "--choice", action="append", metavar="TEXT", help="one of these texts (repeat the flag)"
    )
    constraint.add_argument(
        "--grammar", metavar="GRAMMAR", help="text of a Lark or GBNF grammar (the text, or @FILE)"
    )
    parser.set_defaults(handler=run_generate)

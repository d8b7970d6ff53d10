"""One decode stream's ceiling reconciled with llama.cpp, measured in one run on one machine.

The embedded model's one-row bound, the memory bandwidth over its 13.7 MB of float32 weights,
depends on where those weights are read from: a working set that small can stay in the
last-level cache. This script measures, at the peers' thread count and in interleaved rounds,
the read bandwidth at that working set and at one far larger than the cache, llama.cpp's
decode speed at one sequence (`llama-batched-bench` on the embedded model's f32 GGUF),
llmengine's eager one-row step and one stream through its engine with the decode graph
(compiled first, for these threads), and writes `reports/wallclock/one-row-ceiling.md`,
which lesson 25 reads. It uses the llama.cpp that `make peers` builds into `.cache/peers/`
and builds nothing.

Usage: .venv/bin/python scripts/one_row_ceiling.py [--threads N] [--rounds R] [--skip-llamacpp]
           [--gguf EMBEDDED.gguf]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import llmengine
from llmengine.bench.peers import llamacpp, plan
from llmengine.lessons import one_row
from llmengine.lessons.artifacts import machine_line, write_report
from llmengine.lessons.roofline import BYTES_PER_WEIGHT
from llmengine.lessons.step_cost import weights_multiplied

REPORT = "one-row-ceiling"
LLAMACPP_CALLS = 5  # per round


def llamacpp_decode(threads: int, gguf: Path | None) -> tuple[Callable[[], float], str]:
    """A call timing llama.cpp's one-sequence decode on the embedded model, and its version.

    Without `gguf`, the embedded model is converted by `make peers`' converter (prepared, with
    the binaries, in `.cache/peers/`); with it, that f32 GGUF is used and only the built
    binaries are needed."""
    cache = plan.cache_dir()
    if gguf is None:
        llama = llamacpp.prepare(cache, build=False)
        gguf = llamacpp.convert(
            llama, llmengine.embedded_model_path(), cache / "gguf" / "embedded.gguf"
        )
    else:
        bin_dir = cache / "llama-build" / "bin"
        sdist = sorted((cache / "sdist").glob("llama_cpp_python-*.tar.gz"))[-1]
        version = llamacpp._version(bin_dir, sdist) + f"; GGUF given: {gguf.name}"
        llama = llamacpp.LlamaCpp(cache, bin_dir, Path(sys.executable), version)

    def decode() -> float:
        """The fastest of a few calls: each takes under a second, and llama.cpp's threads wait
        for each other at every operator, so a descheduled one slows a whole call. A call that
        prints no row is left out: on a busy machine the binary sometimes exits before its
        logging thread writes anything."""
        speeds = []
        for _ in range(LLAMACPP_CALLS):
            try:
                speeds.append(
                    llamacpp.batched_bench(
                        llama,
                        gguf,
                        [1],
                        one_row.PROMPT_TOKENS,
                        one_row.GENERATED_TOKENS,
                        threads,
                        timeout=300,
                        seconds="t_tg",
                    )[1]
                )
            except RuntimeError as error:
                print(f"llama.cpp call left out: {error}", flush=True)
        if not speeds:
            raise RuntimeError(f"none of {LLAMACPP_CALLS} llama-batched-bench calls printed a row")
        return max(speeds)

    return decode, llama.version


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threads", type=int, default=2, help="threads of every measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument(
        "--gguf", type=Path, help="an f32 GGUF of the embedded model, instead of converting one"
    )
    args = parser.parse_args(argv)
    if args.skip_llamacpp:
        decode, version = None, "skipped"
    else:
        decode, version = llamacpp_decode(args.threads, args.gguf)
    model = llmengine.load_model()
    weight_bytes = weights_multiplied(model.config) * BYTES_PER_WEIGHT["float32"]
    torch.set_num_threads(args.threads)  # the decode graph is compiled for these threads
    stream = one_row.engine_stream(model)
    run = one_row.measure(model, weight_bytes, decode, args.threads, args.rounds, stream=stream)
    header = (
        f"{machine_line()}; last-level cache {one_row.last_level_cache()}. llama.cpp: {version}. "
        f"Command: `{' '.join(['scripts/one_row_ceiling.py', *map(shlex.quote, argv)])}`."
    )
    print(f"wrote {write_report(REPORT, one_row.report(run, header), wallclock=True)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

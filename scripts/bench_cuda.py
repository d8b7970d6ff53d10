"""The engine on a GPU as a GPU user measures it: TTFT, decode and whole-run tokens/s by batch.

For each batch size (1, 8, 64, 256 by default), a uniform burst (128-token prompts, 64 new
tokens each, greedy) runs through llmengine eager, through transformers `generate` with a
static cache and its forward compiled (the GPU user's default; on a GPU `generate` compiles
by itself with a static cache) and through llmengine's decode graph, all on the same weights
and one clock (`llmengine.bench.gpu_burst`). The share of the memory-bandwidth bound is the
bytes a decode step must read (every weight, each row's K/V) over its time, against the bound
from the device (memory clock x bus width) or `--bandwidth-gbs`. The issue's targets are rows
of their own (`llmengine.bench.gpu_targets`).

The runs go eager first, then transformers, then the decode graph (whose compilation is the
longest), each batch only while `--budget-s` lasts; the report is rewritten after every run,
so a run cut short still leaves the rows it finished. The model is `--model DIR`, or a random
Llama in the Llama 3.2 1B shape. Writes `reports/wallclock/cuda-throughput.md`.

Usage: python scripts/bench_cuda.py [--model DIR] [--batch-sizes 1,64,256,8] [--budget-s 270]
A wall-clock benchmark, not a test: its numbers belong to the GPU and the moment that ran it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import llmengine
from llmengine.bench import gpu_burst, throughput
from llmengine.bench.compiled_runners import cpu_compile_config
from llmengine.bench.gpu_targets import EAGER, GRAPH, TRANSFORMERS, graph_agreement, target_rows
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.model.config import DTYPES

REPORT = "cuda-throughput"
H200_BANDWIDTH_GBS = 4800.0
ONE_B_SHAPE = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
KINDS = (EAGER, TRANSFORMERS, GRAPH)  # the order they run in, and within a batch, are shown


def device_bandwidth_gbs(device: torch.device) -> float | None:
    """Peak memory bandwidth from the device's memory clock (kHz) and bus width (bits).

    Double data rate: two transfers per clock. None off CUDA, or when torch does not say.
    """
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


class Bench:
    """The runs of one benchmark, and a note per (engine, batch): why it is missing, or more."""

    def __init__(self, args: argparse.Namespace, folder: Path, device: torch.device) -> None:
        import transformers

        self.args, self.device = args, device
        self.model = llmengine.load_model(folder, device=str(device), dtype=args.dtype)
        hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=DTYPES[args.dtype])
        self.hf = hf.to(device).eval()
        self.runs: list[gpu_burst.BurstRun] = []
        self.notes: dict[tuple[str, int], str] = {}
        # A GPU compiles on a static cache by itself; a CPU only when told it may.
        self.generate_options: dict[str, Any] = {"cache_implementation": "static"}
        if args.no_compile_transformers:
            self.generate_options["disable_compile"] = True
        elif device.type != "cuda":
            self.generate_options["compile_config"] = cpu_compile_config()

    def bursts(self, batch: int) -> tuple[list, list]:
        """The timed burst and its warm-up: the same shape, other prompts."""
        shape = (batch, self.args.prompt_len, self.args.max_tokens)
        vocab = self.model.config.vocab_size
        return llmengine.uniform_burst(*shape, vocab_size=vocab, seed=1), llmengine.uniform_burst(
            *shape, vocab_size=vocab, seed=2
        )

    def run(self, kind: str, batch: int) -> None:
        workload, warmup = self.bursts(batch)
        block_size = self.args.block_size
        if kind == TRANSFORMERS:
            run = gpu_burst.generate_burst(self.hf, workload, warmup, kind, **self.generate_options)
            compiled = "compiled" if gpu_burst.generate_compiles(self.hf) else "NOT compiled"
            self.notes[kind, batch] = f"forward {compiled}"
        elif kind == EAGER:
            engine = gpu_burst.engine_for(self.model, workload, block_size)
            run = gpu_burst.engine_burst(engine, workload, warmup, kind)
        else:
            try:
                engine = gpu_burst.engine_for(
                    self.model, workload, block_size, decode_graph=(batch,)
                )
            except Exception as error:  # the report says why, and the other rows still run
                reason = throughput.failure_reason(error).removeprefix("did not run: ")
                self.notes[kind, batch] = f"not built: {reason}"
                return
            run = gpu_burst.engine_burst(engine, workload, warmup, kind)
            self.notes[kind, batch] = (
                f"{attention_of(engine.runner.graphs)}"
                f"captured in {engine.runner.graph_compile_seconds:.1f} s at start-up; "
                f"{engine.runner.graph_steps} steps of warm-up and run on the graph"
            )
        self.runs.append(run)
        eager = [r for r in self.runs if r.engine == EAGER and r.batch == batch]
        if kind != EAGER and eager:
            same = sum(a == b for a, b in zip(run.outputs, eager[0].outputs, strict=True))
            notes = [self.notes[kind, batch]] if (kind, batch) in self.notes else []
            self.notes[kind, batch] = "; ".join([*notes, f"tokens of {same}/{batch} as eager's"])


def attention_of(graphs: object) -> str:
    """How the CUDA decode graphs attend ("paged attention; "), and why the paged kernel was
    given up if it was; nothing for a CPU's compiled graphs, which have one way only."""
    kinds = sorted(set(getattr(graphs, "attention", {}).values()))
    if not kinds:
        return ""
    failure = getattr(graphs, "paged_failure", None)
    given_up = f" (paged given up: {failure})" if failure else ""
    return f"{'/'.join(kinds)} attention{given_up}; "


def numbers(run: gpu_burst.BurstRun, bound: float | None) -> list[float]:
    """A run's columns in the table's units; NaN (shown n/a) where it has no such number."""
    ms = 1e3

    def scaled(value: float | None, unit: float = 1.0) -> float:
        return float("nan") if value is None else value * unit

    share = run.bandwidth_gbs / bound if run.bandwidth_gbs is not None and bound else None
    return [scaled(run.ttft_s, ms), scaled(run.step_s, ms), scaled(run.decode_tokens_per_s),
            scaled(share), run.whole_s, run.whole_tokens_per_s]  # fmt: skip


def table(bench: Bench, bound: float | None) -> str:
    """Every (batch, engine) in run order: its numbers, or only the note saying why none."""
    rows = []
    for batch in sorted(bench.args.batch_sizes):
        for kind in KINDS:
            note = bench.notes.get((kind, batch), "")
            found = [run for run in bench.runs if run.engine == kind and run.batch == batch]
            if found:
                rows.append([batch, kind, *numbers(found[0], bound), note])
            elif note:
                rows.append([batch, kind, *[float("nan")] * 6, note])
    headers = ["batch", "engine", "TTFT ms", "decode step ms", "decode tok/s", "of bound",
               "whole s", "whole tok/s", "notes"]  # fmt: skip
    return markdown_table(rows, headers, ["d", "", ".1f", ".2f", ",.0f", ".1%", ".3f", ",.0f", ""])


def report(bench: Bench, bound: float | None, source: str, parameters: int) -> str:
    args = bench.args
    gpu = torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else "none"
    machine = [
        *throughput.machine_description(),
        ("device", f"{bench.device.type}: {gpu}"),
        ("CUDA (torch built with)", str(torch.version.cuda)),
    ]
    bound_text = f"{bound:.0f} GB/s ({source})" if bound else "unknown (no device figure)"
    return "\n".join([
        f"# The engine on {gpu if bench.device.type == 'cuda' else bench.device.type}\n",
        f"Model: {args.model or 'random Llama, Llama 3.2 1B shape'} ({parameters / 1e9:.2f}B "
        f"parameters), {args.dtype}; uniform bursts of {args.prompt_len}-token prompts, "
        f"{args.max_tokens} new tokens each, greedy. Bandwidth bound {bound_text}.\n",
        f"One clock for every row: {gpu_burst.TIMER}. TTFT is the start to the end of the "
        "prefill step; decode is the rest (whole = TTFT + decode); every timed run is the "
        "second call of its engine (the first compiles, loads kernels, plans). transformers "
        "is timed as one call: whole run only. MB a decode step must read: every weight once "
        "plus each row's K/V, the least it can move, so `of bound` is an upper limit's.\n",
        table(bench, bound),
        "## Targets\n",
        markdown_table(target_rows(bench.runs, bound),
                       ["batch", "target", "goal", "measured", "met"]),  # fmt: skip
        "## Decode graph tokens against eager\n",
        markdown_table(graph_agreement(bench.runs) or [["-", "no graph run"]],
                       ["batch", "identical"]),  # fmt: skip
        "## Machine\n",
        markdown_table(machine, ["", ""]),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> Bench:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, metavar="DIR")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try it")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    # In the order they run, the targets' batches first; the table sorts them.
    parser.add_argument("--batch-sizes", default="1,64,256,8", metavar="B,B",
                        type=lambda text: [int(b) for b in text.split(",")])  # fmt: skip
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-graph", action="store_true", help="leave out the decode graph")
    parser.add_argument("--no-compile-transformers", action="store_true",
                        help="transformers on its static cache, uncompiled")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="start no run after this many seconds (default 270)")  # fmt: skip
    parser.add_argument("--bandwidth-gbs", type=float, default=None, metavar="GB/S",
                        help="the bound (default: from the device, else the H200's)")  # fmt: skip
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_cuda.py: torch sees no CUDA device; this benchmark needs one")
    if args.max_tokens < 2:
        sys.exit("bench_cuda.py: --max-tokens must be at least 2 (one prefill token, one decode)")
    deadline = time.monotonic() + args.budget_s
    measured = device_bandwidth_gbs(device)
    bound = (
        args.bandwidth_gbs or measured or (H200_BANDWIDTH_GBS if device.type == "cuda" else None)
    )
    source = "--bandwidth-gbs" if args.bandwidth_gbs else "device" if measured else "H200 default"
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model or Path(scratch)
        if args.model is None:
            throughput.save_random_checkpoint(folder, **ONE_B_SHAPE)
        bench = Bench(args, folder, device)
    parameters = throughput.parameter_count(bench.model)
    path = Path()
    for kind in KINDS:
        for batch in args.batch_sizes:
            if kind == GRAPH and args.no_graph:
                bench.notes[kind, batch] = "not run (--no-graph)"
            elif time.monotonic() > deadline:
                bench.notes[kind, batch] = f"skipped: past the {args.budget_s:.0f} s budget"
            else:
                try:
                    bench.run(kind, batch)
                except Exception as error:  # the report says why, and the other rows still run
                    bench.notes[kind, batch] = throughput.failure_reason(error)
                print(
                    f"{kind}, batch {batch}: {bench.notes.get((kind, batch), 'done')}", flush=True
                )
            path = write_report(REPORT, report(bench, bound, source, parameters), wallclock=True)
    print(f"wrote {path}")
    return bench


if __name__ == "__main__":
    main()

"""Kernels chosen by measurement, and narrower weights: what each costs and gains here.

Three models: the embedded one, the held-out random 25M (`decode_step.HELD_OUT_SHAPE`) and a
random ~100M with a 32,000-token vocabulary (`decode_step.SHAPE_100M`). For each:

- the kernel table: every distinct matrix product of a forward, timed through each
  candidate kernel at each row bucket, and the one kept (`Llama.kernel_measurements`);
- decode throughput, 1, 8 and 32 sequences at once (32-token prompts), for the kernel
  preparations in float32 (eager `F.linear`, MKL packed for 4-48 rows, measured) and for the
  narrower precisions (bfloat16, int8, int8 with bfloat16 activations), in interleaved
  rounds, median kept, greedy tokens compared with float32's;
- on the embedded model, what each precision costs in accuracy (`bench.precision`).

Writes `reports/wallclock/kernels.md`.

Usage: .venv/bin/python scripts/bench_kernels.py [--threads T] [--repeats N] [--quick]
A wall-clock benchmark, not a test: its numbers belong to the machine and the moment that ran it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
from bench_decode_step import machine  # scripts/ is on the path when this script runs

import llmengine
from llmengine.bench import precision, throughput
from llmengine.bench.decode_step import HELD_OUT_CONFIG, SHAPE_100M_CONFIG, random_llama
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.model.llama import Llama
from llmengine.speed.kernels import KERNELS
from llmengine.speed.prepare import products
from llmengine.speed.quantization import Int8Weight

REPORT = "kernels"
PROMPT_LEN = 32


def engines_for(model: Llama) -> dict[str, Llama]:
    """The float32 model under each kernel preparation, then each narrower precision."""
    f32 = precision.PRECISIONS[0]
    versions = {f"float32, {k}": precision.in_precision(model, f32, k) for k in ("eager", "packed")}
    for choice in precision.PRECISIONS:
        versions[f"{choice.name}, measured"] = precision.in_precision(model, choice)
    return versions


def kernel_rows(label: str, model: Llama) -> list[list[object]]:
    rows = []
    for product, measurement in model.kernel_measurements().items():
        for bucket in measurement.buckets:
            times = [bucket.seconds.get(name) for name in KERNELS]
            rows.append(
                [
                    label,
                    f"{product} {list(measurement.shape)}",
                    bucket.rows,
                    *(float("nan") if t is None else 1e6 * t for t in times),
                    bucket.chosen,
                    bucket.speedup,
                ]
            )
    return rows


def throughput_rows(
    label: str, versions: dict[str, Llama], batches: Sequence[int], tokens: int, repeats: int
) -> list[list[object]]:
    rows = []
    vocab = next(iter(versions.values())).config.vocab_size
    for batch in batches:
        workload = llmengine.uniform_burst(batch, PROMPT_LEN, tokens, vocab_size=vocab, seed=1)
        runners = {
            name: (lambda w, m=m: throughput.run_llmengine(m, w)) for name, m in versions.items()
        }
        runs = throughput.compare_engines(runners, workload, repeats=repeats)
        baseline = runs["float32, eager"]
        reference = runs["float32, measured"].outputs
        for name, run in runs.items():
            agreement = precision.greedy_agreement(reference, run.outputs)
            rows.append(
                [
                    label,
                    batch,
                    name,
                    run.tokens_per_s,
                    throughput.speedup(run, baseline),
                    f"{agreement.identical}/{agreement.sequences}",
                    ", ".join(f"{v:.1f}" for v in os.getloadavg()),
                ]
            )
    return rows


def accuracy_rows(model: Llama, prompts: int, tokens: int) -> list[list[object]]:
    tokenizer = llmengine.load_tokenizer()
    ids = precision.held_out_ids(tokenizer)
    starts = precision.prompts_from(ids, prompts, 16)
    reference = precision.in_precision(model, precision.PRECISIONS[0])
    reference_text = precision.greedy_continuations(reference, starts, tokens)
    rows = []
    for choice in precision.PRECISIONS:
        converted = precision.in_precision(model, choice)
        agreement = precision.greedy_agreement(
            reference_text, precision.greedy_continuations(converted, starts, tokens)
        )
        weight_bytes = sum(
            g.kernel.values.numel() + 2 * g.kernel.scales.numel()
            if isinstance(g.kernel, Int8Weight)
            else g.weight.numel() * g.weight.element_size()
            for g in products(converted)
        )
        rows.append(
            [
                choice.name,
                weight_bytes / 1e6,
                precision.max_logit_difference(converted, reference, ids[:256]),
                f"{agreement.identical}/{agreement.sequences}",
                agreement.prefix_share,
                precision.perplexity(converted, ids),
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per workload")
    parser.add_argument("--quick", action="store_true", help="fewer shapes, a smoke run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    setting = machine()
    models = {
        "embedded": llmengine.load_model(kernels="eager"),
        "random 25M": random_llama(HELD_OUT_CONFIG),
        "random 100M": random_llama(SHAPE_100M_CONFIG),
    }
    batches, tokens = ((1, 8), 16) if args.quick else ((1, 8, 32), 64)
    kernels, speeds = [], []
    for label, model in models.items():
        if args.quick and label == "random 100M":
            continue
        versions = engines_for(model)
        kernels += kernel_rows(label, versions["float32, measured"])
        speeds += throughput_rows(label, versions, batches, tokens, args.repeats)
        print(f"{label}: done at {time.perf_counter() - start:.0f} s", flush=True)
    prompts, accuracy_tokens = (8, 16) if args.quick else (64, 64)
    accuracy = accuracy_rows(models["embedded"], prompts, accuracy_tokens)
    setting.append(("load average at the end", ", ".join(f"{v:.2f}" for v in os.getloadavg())))
    setting.append(("seconds", f"{time.perf_counter() - start:.0f}"))
    text = "\n\n".join(
        [
            "# Kernels and precisions\n\n"
            + markdown_table(setting, ["setting", "value"])
            + f"\n\nCommand: `scripts/bench_kernels.py --threads {args.threads} --repeats "
            f"{args.repeats}{' --quick' if args.quick else ''}`",
            "## The kernel of each product, by rows (microseconds per product)\n\n"
            + markdown_table(
                kernels,
                ["model", "product", "rows", *KERNELS, "kept", "eager / kept"],
                ["", "", "d", *[".1f"] * len(KERNELS), "", ".2f"],
            ),
            f"## Decode throughput ({PROMPT_LEN}-token prompts, {tokens} tokens each)\n\n"
            "Greedy agreement: continuations identical to float32 with measured kernels.\n\n"
            + markdown_table(
                speeds,
                [
                    "model",
                    "sequences",
                    "weights, kernels",
                    "tok/s",
                    "vs float32 eager",
                    "same greedy text",
                    "load",
                ],
                ["", "d", "", ".0f", ".2f", "", ""],
            ),  # fmt: skip
            f"## What narrower weights cost: the embedded model, {prompts} prompts x "
            f"{accuracy_tokens} tokens, perplexity on Act I of Macbeth (never trained on)\n\n"
            + markdown_table(
                accuracy,
                [
                    "weights",
                    "MB of weights",
                    "max logit difference",
                    "identical continuations",
                    "share before the first difference",
                    "held-out perplexity",
                ],
                ["", ".2f", ".4f", "", ".1%", ".3f"],
            ),  # fmt: skip
        ]
    )
    print(f"wrote {write_report(REPORT, text + chr(10), wallclock=True)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What speculative decoding by prompt lookup buys on this machine: tokens/s with and without it.

The embedded model, greedy, `--tokens` tokens a stream past the end token, for each batch size
(the first prompts of `llmengine.lessons.speculation.PROMPTS`): without speculation and with
n-gram speculation at each k, the configurations interleaved in every round after one untimed
warm-up of each (which also lets measured kernels time every row count), the median of
`--rounds` rounds kept. Per configuration: forwards, tokens per forward, the share of drafts
kept, tokens/s, the time of one forward and its ratio to a forward without drafts, and the
speed-up. Writes `reports/wallclock/speculative.md` with the machine it ran on.

Usage: bench_speculative.py [--batches 1,4,8] [--ks 1,3,5] [--tokens 100] [--rounds 3]
                            [--kernels measured] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch

import llmengine
from llmengine.bench.throughput import machine_description
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.lessons.speculation import (
    PROMPTS,
    SPEED_FORMATS,
    SPEED_HEADERS,
    faster_or_slower,
    speed_rows,
    time_runs,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--ks", default="1,3,5")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", default="measured", choices=("measured", "packed", "eager"))
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    batches = [int(part) for part in args.batches.split(",")]
    ks = [int(part) for part in args.ks.split(",")]
    if max(batches) > len(PROMPTS):
        parser.error(f"at most {len(PROMPTS)} streams (one per prompt)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = llmengine.load_model(kernels=args.kernels)
    tokenizer = llmengine.load_tokenizer()
    prompts = [tokenizer.encode(prompt) for prompt in PROMPTS]
    speeds = speed_rows(time_runs(model, prompts, batches, [None, *ks], args.tokens, args.rounds))
    one = {speed.k: speed for speed in speeds if speed.batch == batches[0]}
    best = max(ks, key=lambda k: one[k].speedup)
    summary = (
        f"At {batches[0]} stream(s) the best k is {best}: {one[best].tokens_per_s:,.0f} tokens/s "
        f"against {one[None].tokens_per_s:,.0f} without, {faster_or_slower(one[best].speedup)} "
        f"without speculation."
    )
    machine = "\n".join(f"- {name}: {value}" for name, value in machine_description())
    text = (
        "# Speculative decoding by prompt lookup on this machine\n\n"
        f"The embedded model, {args.kernels} kernels, greedy, {args.tokens} tokens a stream "
        f"(past the end token), n-gram speculation at k = {', '.join(map(str, ks))} against "
        f"none; median of {args.rounds} interleaved rounds after a warm-up.\n\n"
        + markdown_table([speed.row() for speed in speeds], SPEED_HEADERS, SPEED_FORMATS)
        + f"\n{summary}\n\n## Machine (load read after the runs)\n\n{machine}\n"
    )
    print(text)
    write_report("speculative", text, wallclock=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What speculative decoding by prompt lookup buys on this machine: tokens/s with and without it.

The embedded model, greedy, `--tokens` tokens a stream past the end token, for each batch size
(the first prompts of `llmengine.lessons.speculation.PROMPTS`): without speculation and with
n-gram speculation at each k, the configurations interleaved in every round after one untimed
warm-up of each (which also lets measured kernels time every row count), the median of
`--rounds` rounds kept. Per configuration: forwards, tokens per forward, the share of drafts
kept, tokens/s, the time of one forward and its ratio to a forward without drafts, and the
speed-up. Then, for one stream at k = `--draft-k`, a draft model against prompt lookup: the
embedded model's own first `--draft-layers` layers (`save_self_draft`), timed the same way.
Writes `reports/wallclock/speculative.md` with the machine it ran on.

Usage: bench_speculative.py [--batches 1,4,8] [--ks 1,3,5] [--tokens 100] [--rounds 3]
                            [--kernels measured] [--threads N] [--draft-layers 1,2]
                            [--draft-k 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import llmengine
from llmengine.bench.throughput import machine_description
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.lessons.speculation import PROMPTS, generate_counted
from llmengine.lessons.speculation_cost import (
    SPEED_FORMATS,
    SPEED_HEADERS,
    faster_or_slower,
    speed_rows,
    time_runs,
)
from llmengine.speculative.draft import save_self_draft


def draft_rows(
    model: llmengine.Llama, prompt: list[int], layers: list[int], k: int, tokens: int, rounds: int
) -> list[list[object]]:
    """One stream: no speculation, prompt lookup and each self-draft, at k drafts; warmed
    up, then `rounds` rounds with the proposers interleaved, the median kept."""
    with tempfile.TemporaryDirectory() as folder:
        proposers: dict[str, tuple[int | None, str]] = {
            "none": (None, "ngram"),
            "ngram": (k, "ngram"),
        }
        for count in layers:
            path = save_self_draft(
                llmengine.embedded_model_path(), Path(folder) / str(count), count
            )
            proposers[f"self-draft, {count} of {model.config.num_hidden_layers} layers"] = (
                k,
                str(path),
            )
        for draws, proposer in proposers.values():
            generate_counted(model, [prompt], tokens, draws, proposer)
        timed: dict[str, list] = {name: [] for name in proposers}
        for _ in range(rounds):
            for name, (draws, proposer) in proposers.items():
                timed[name].append(generate_counted(model, [prompt], tokens, draws, proposer))
    base = statistics.median(run.seconds for run in timed["none"])
    rows = []
    for name, runs in timed.items():
        seconds = statistics.median(run.seconds for run in runs)
        proposed = sum(made for made, _ in runs[0].drafts)
        kept = sum(accepted for _, accepted in runs[0].drafts)
        rows.append(
            [name, runs[0].forwards, proposed, kept, runs[0].tokens / seconds, base / seconds]
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--ks", default="1,3,5")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", default="measured", choices=("measured", "packed", "eager"))
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--draft-layers", default="1,2", help="self-draft sizes, in layers")
    parser.add_argument("--draft-k", type=int, default=3, help="drafts per step for them")
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
    layers = [int(part) for part in args.draft_layers.split(",")]
    drafts = draft_rows(model, prompts[0], layers, args.draft_k, args.tokens, args.rounds)
    draft_table = markdown_table(
        drafts,
        ["proposer", "forwards", "drafts proposed", "drafts kept", "tokens/s", "speed-up"],
        ["", "d", "d", "d", ",.0f", ".2f"],
    )
    machine = "\n".join(f"- {name}: {value}" for name, value in machine_description())
    text = (
        "# Speculative decoding by prompt lookup on this machine\n\n"
        f"The embedded model, {args.kernels} kernels, greedy, {args.tokens} tokens a stream "
        f"(past the end token), n-gram speculation at k = {', '.join(map(str, ks))} against "
        f"none; median of {args.rounds} interleaved rounds after a warm-up.\n\n"
        + markdown_table([speed.row() for speed in speeds], SPEED_HEADERS, SPEED_FORMATS)
        + f"\n{summary}\n\n## A draft model against prompt lookup\n\n"
        f"One stream, k = {args.draft_k}, the same prompt and tokens; the drafts are the "
        "embedded model's own first layers (`save_self_draft`), with no training.\n\n"
        + draft_table
        + f"\n## Machine (load read after the runs)\n\n{machine}\n"
    )
    print(text)
    write_report("speculative", text, wallclock=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

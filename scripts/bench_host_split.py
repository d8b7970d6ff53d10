"""Host work against the forward, per decode step of one stream of the embedded model.

One greedy stream (a 16-token prompt, `--tokens` new tokens) through an eager engine of one
slot, at 1 and at 2 torch threads, the settings taking turns over `--rounds` rounds; each
keeps its median of every stage of the step (`llmengine.bench.host_split`): the host's work
(propose, schedule, prepare the inputs, sample and read the token back, update, the rest)
and the forward. Then one cProfile over `--profile-steps` steps of `Engine.step` at 1 thread
names the functions the step spends its time in. Writes `reports/wallclock/host-split.md`
with the machine it ran on.

Usage: bench_host_split.py [--tokens 128] [--rounds 5] [--profile-steps 128]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

import llmengine
from llmengine.bench.host_split import HOST_STAGES, StageClock, median_split, stream_split
from llmengine.bench.throughput import machine_description
from llmengine.lessons.artifacts import markdown_table, write_report

PROMPT = list(range(1, 17))
THREADS = (1, 2)


def profile_text(engine: llmengine.Engine, steps: int) -> str:
    """The 20 functions of most cumulative time over `steps` decode steps (cProfile)."""
    engine.add_request(PROMPT, llmengine.SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    engine.step()
    profile = cProfile.Profile()
    profile.enable()
    while engine.has_unfinished():
        engine.step()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).strip_dirs().sort_stats("cumulative").print_stats(20)
    return out.getvalue().split("\n\n", 1)[-1].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=128)
    args = parser.parse_args()
    model = llmengine.load_model()
    engine = llmengine.Engine(model, num_blocks=64, num_slots=1)
    clock = StageClock(engine)
    runs: dict[int, list[dict[str, float]]] = {threads: [] for threads in THREADS}
    stream_split(engine, clock, PROMPT, 8)  # warm: allocators, caches
    for _ in range(args.rounds):
        for threads in THREADS:
            torch.set_num_threads(threads)
            runs[threads].append(stream_split(engine, clock, PROMPT, args.tokens))
    torch.set_num_threads(1)
    profile = profile_text(llmengine.Engine(model, num_blocks=64, num_slots=1), args.profile_steps)
    stages = ("step", "forward", "host", *HOST_STAGES)
    rows = []
    for threads in THREADS:
        split = median_split(runs[threads])
        rows.append([threads, *(split[name] * 1e3 for name in stages), split["tokens_per_s"]])
    text = "\n".join([
        "# Host work against the forward, one stream\n",
        f"The embedded model ({model.config.num_hidden_layers} layers, hidden size "
        f"{model.config.hidden_size}), eager, one slot: one greedy stream of {args.tokens} "
        f"tokens after a {len(PROMPT)}-token prompt; milliseconds per decode step, medians "
        f"over the steps and then over {args.rounds} rounds, the thread counts in turn. "
        "`host` is the step less its forward (every stage but the forward, which is `rest` "
        "included: taking requests up, the outcome); tokens/s counts decode steps only.\n",
        markdown_table(rows, ["threads", *stages, "tokens/s"],
                       ["", *[".3f"] * len(stages), ".0f"]),
        f"Where the step's time goes at 1 thread: cProfile over {args.profile_steps} decode "
        "steps (the profiler's own cost inflates Python's share):\n",
        "```", profile, "```\n",
        "## Machine\n",
        markdown_table(machine_description(), ["", ""]),
    ])  # fmt: skip
    print(text)
    print(f"wrote {write_report('host-split', text, wallclock=True)}")


if __name__ == "__main__":
    main()

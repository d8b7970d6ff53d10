"""Host work against the forward, per decode step of one stream of the embedded model.

One greedy stream (a 16-token prompt, `--tokens` new tokens) through eager engines of one
slot, without and with the overlap (`EngineConfig.overlap`: the next step's inputs built on
a worker thread while the forward runs), at 1 and at 2 torch threads, the four settings
taking turns over `--rounds` rounds; each keeps its median of every stage of the step
(`llmengine.bench.host_split`): the host's work (propose, schedule, prepare the inputs,
sample and read the token back, update, the rest) and the forward. Both engines' tokens are
checked equal. Then one cProfile over `--profile-steps` steps of `Engine.step` at 1 thread
without the overlap names the functions the step spends its time in. Writes
`reports/wallclock/host-split.md` with the machine it ran on.

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
OVERLAP = (False, True)


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


def overlap_effect(runs: dict[tuple[int, bool], list[dict[str, float]]]) -> list[str]:
    """One sentence per thread count: what the overlap changed in host time, forward and
    tokens/s (medians over the rounds)."""
    lines = []
    for threads in THREADS:
        off, on = median_split(runs[threads, False]), median_split(runs[threads, True])
        lines.append(
            f"- {threads} thread(s): the overlap changes the host's time per step from "
            f"{off['host'] * 1e3:.3f} to {on['host'] * 1e3:.3f} ms "
            f"({on['host'] / off['host'] - 1:+.0%}), the forward's from "
            f"{off['forward'] * 1e3:.3f} to {on['forward'] * 1e3:.3f} ms, and tokens/s from "
            f"{off['tokens_per_s']:.0f} to {on['tokens_per_s']:.0f} "
            f"({on['tokens_per_s'] / off['tokens_per_s'] - 1:+.0%})."
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=128)
    args = parser.parse_args()
    model = llmengine.load_model()
    engines = {
        overlap: llmengine.Engine(model, num_blocks=64, num_slots=1, overlap=overlap)
        for overlap in OVERLAP
    }
    params = llmengine.SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    tokens = {overlap: engine.generate([PROMPT], params) for overlap, engine in engines.items()}
    if tokens[False] != tokens[True]:
        raise SystemExit("the overlap changed the tokens: nothing timed")
    clocks = {overlap: StageClock(engine) for overlap, engine in engines.items()}
    settings = [(threads, overlap) for threads in THREADS for overlap in OVERLAP]
    runs: dict[tuple[int, bool], list[dict[str, float]]] = {setting: [] for setting in settings}
    for _ in range(args.rounds):
        for threads, overlap in settings:
            torch.set_num_threads(threads)
            split = stream_split(engines[overlap], clocks[overlap], PROMPT, args.tokens)
            runs[threads, overlap].append(split)
    torch.set_num_threads(1)
    profile = profile_text(llmengine.Engine(model, num_blocks=64, num_slots=1), args.profile_steps)
    stages = ("step", "forward", "host", *HOST_STAGES)
    rows = []
    for threads, overlap in settings:
        split = median_split(runs[threads, overlap])
        rows.append(
            [threads, "on" if overlap else "off", *(split[name] * 1e3 for name in stages),
             split["tokens_per_s"]]
        )  # fmt: skip
    text = "\n".join([
        "# Host work against the forward, one stream\n",
        f"The embedded model ({model.config.num_hidden_layers} layers, hidden size "
        f"{model.config.hidden_size}), eager, one slot: one greedy stream of {args.tokens} "
        f"tokens after a {len(PROMPT)}-token prompt; milliseconds per decode step, medians "
        f"over the steps and then over {args.rounds} rounds, the settings in turn. `host` is "
        "the step less its forward, step by step: the host's work the step waits for (with "
        "the overlap, what the worker built during the forward is not in it); `rest` is what "
        "no stage names: taking requests up, the outcome, with the overlap starting the "
        "worker's guess. The step and the forward are bimodal on a shared machine (a forward "
        "takes about 3 ms or about 7 ms, as the core is ours or not), so their medians may "
        "fall in different modes; tokens/s (decode steps over their total time) is the "
        "steady measure. The two engines' tokens are the same.\n",
        *overlap_effect(runs),
        markdown_table(rows, ["threads", "overlap", *stages, "tokens/s"],
                       ["", "", *[".3f"] * len(stages), ".0f"]),
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

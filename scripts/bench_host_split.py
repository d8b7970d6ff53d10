"""Host work against the forward, per decode step of one stream of the embedded model.

One greedy stream (a 16-token prompt, `--tokens` new tokens) through engines of one slot on
three paths: eager, eager with the overlap (`EngineConfig.overlap`: the next step's inputs
built on a worker thread while the forward runs), and the decode graph (`decode_graph=[1]`:
the step compiled by inductor, its inputs written into persistent arrays, its greedy picks
made inside it). Each path runs at 1 and at 2 torch threads (the graph compiled at each
count, since inductor's kernels are generated for the thread count they are compiled at),
the six settings taking turns over `--rounds` rounds; each keeps its median of every stage
of the step (`llmengine.bench.host_split`): the host's work (propose, schedule, prepare the
inputs, sample and read the token back, update, the rest) and the forward. Every engine's
tokens are checked equal. Then one cProfile over `--profile-steps` steps of `Engine.step` at
1 thread, eager and with the graph, names the functions each step spends its time in.
Writes `reports/wallclock/host-split.md` with the machine it ran on.

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
PATHS = ("eager", "eager + overlap", "decode graph")
STAGES = ("step", "forward", "host", *HOST_STAGES)


def engine_for(model: llmengine.Llama, path: str) -> llmengine.Engine:
    """A one-slot engine on `path`, built (and its graph compiled) at the current threads."""
    return llmengine.Engine(
        model,
        num_blocks=64,
        num_slots=1,
        overlap=path == "eager + overlap",
        decode_graph=[1] if path == "decode graph" else False,
    )


def profile_text(engine: llmengine.Engine, steps: int) -> str:
    """The 16 functions of most cumulative time over `steps` decode steps (cProfile)."""
    engine.add_request(PROMPT, llmengine.SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    engine.step()
    profile = cProfile.Profile()
    profile.enable()
    while engine.has_unfinished():
        engine.step()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).strip_dirs().sort_stats("cumulative").print_stats(16)
    return out.getvalue().split("\n\n", 1)[-1].strip()


def change(before: dict[str, float], after: dict[str, float], what: str) -> str:
    """What changed from `before` to `after` in host time, forward and tokens/s, in words."""
    return (
        f"{what} changes the host's time per step from {before['host'] * 1e3:.3f} to "
        f"{after['host'] * 1e3:.3f} ms ({after['host'] / before['host'] - 1:+.0%}), the "
        f"forward's from {before['forward'] * 1e3:.3f} to {after['forward'] * 1e3:.3f} ms, "
        f"and tokens/s from {before['tokens_per_s']:.0f} to {after['tokens_per_s']:.0f} "
        f"({after['tokens_per_s'] / before['tokens_per_s'] - 1:+.0%})."
    )


def effects(runs: dict[tuple[int, str], list[dict[str, float]]]) -> list[str]:
    """Per thread count, what the overlap and what the decode graph change against eager."""
    lines = []
    for threads in THREADS:
        eager = median_split(runs[threads, "eager"])
        overlap = median_split(runs[threads, "eager + overlap"])
        graph = median_split(runs[threads, "decode graph"])
        lines.append(f"- {threads} thread(s): {change(eager, overlap, 'the overlap')}")
        lines.append(f"  {change(eager, graph, 'The decode graph')}")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=128)
    args = parser.parse_args()
    model = llmengine.load_model()
    settings = [(threads, path) for threads in THREADS for path in PATHS]
    engines = {}
    for threads, path in settings:
        torch.set_num_threads(threads)
        engines[threads, path] = engine_for(model, path)
    params = llmengine.SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    outputs = [engine.generate([PROMPT], params) for engine in engines.values()]
    if any(output != outputs[0] for output in outputs):
        raise SystemExit("the paths gave different tokens: nothing timed")
    clocks = {setting: StageClock(engine) for setting, engine in engines.items()}
    runs: dict[tuple[int, str], list[dict[str, float]]] = {setting: [] for setting in settings}
    for _ in range(args.rounds):
        for threads, path in settings:
            torch.set_num_threads(threads)
            setting = (threads, path)
            runs[setting].append(
                stream_split(engines[setting], clocks[setting], PROMPT, args.tokens)
            )
    torch.set_num_threads(1)
    profiles = {
        path: profile_text(engine_for(model, path), args.profile_steps)
        for path in ("eager", "decode graph")
    }
    rows = []
    for threads, path in settings:
        split = median_split(runs[threads, path])
        rows.append([threads, path, *(split[name] * 1e3 for name in STAGES), split["tokens_per_s"]])
    profile_blocks = []
    for path, text in profiles.items():
        profile_blocks += [f"{path}:\n", "```", text, "```\n"]
    text = "\n".join([
        "# Host work against the forward, one stream\n",
        f"The embedded model ({model.config.num_hidden_layers} layers, hidden size "
        f"{model.config.hidden_size}), one slot: one greedy stream of {args.tokens} tokens "
        f"after a {len(PROMPT)}-token prompt; milliseconds per decode step, medians over the "
        f"steps and then over {args.rounds} rounds, the settings in turn. `host` is the step "
        "less its forward, step by step: the host's work the step waits for (with the "
        "overlap, what the worker built during the forward is not in it; with the graph, its "
        "call's own Python, dynamo's and the generated wrapper's, is in the forward); `rest` "
        "is what no stage names: taking requests up, the outcome, with the overlap starting "
        "the worker's guess. On a shared machine a step's forward sometimes takes twice "
        "another's, as the core is ours or not, so the step's and the forward's medians may "
        "fall in different modes; tokens/s (decode steps over their total time) is the "
        "steady measure. All six engines' tokens are the same.\n",
        *effects(runs),
        markdown_table(rows, ["threads", "path", *STAGES, "tokens/s"],
                       ["", "", *[".3f"] * len(STAGES), ".0f"]),
        f"Where the step's time goes at 1 thread: cProfile over {args.profile_steps} decode "
        "steps (the profiler's own cost inflates Python's share).\n",
        *profile_blocks,
        "## Machine\n",
        markdown_table(machine_description(), ["", ""]),
    ])  # fmt: skip
    print(text)
    print(f"wrote {write_report('host-split', text, wallclock=True)}")


if __name__ == "__main__":
    main()

"""Where one stream's decode step goes on this machine: the forward against the host's work.

One greedy stream of the embedded model through two engines, eager and with the decode graph
of bucket 1 (compiled once, before anything is timed). Each step is split by the clock into
the model runner's forward (`ModelRunner.execute`), its sampling (`Sampler.sample`) and the
rest (proposing, scheduling, the runner's plan and the forward's inputs, updating, the
outcome); the engines take turns over `--rounds` rounds and each keeps its median. Then one
profile of `--profile-steps` steps per engine counts the ATen operators a step dispatches
(top-level ones: an operator another calls is not counted again), the eager step's most
frequent listed: on one stream of a small model the forward is those dispatches, not
arithmetic. Writes `reports/wallclock/host-time.md` with the machine it ran on.

Usage: bench_host_time.py [--tokens 96] [--rounds 3] [--profile-steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

import llmengine
from llmengine.bench.throughput import machine_description
from llmengine.lessons.artifacts import markdown_table, write_report

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


class SplitClock:
    """Seconds per step spent inside the runner's forward and its sampling, by wrapping the
    two methods of one engine's runner (instance attributes: the class is left alone)."""

    def __init__(self, engine: llmengine.Engine) -> None:
        self.forward: list[float] = []
        self.sample: list[float] = []
        runner = engine.runner
        runner.execute = self._timed(runner.execute, self.forward)  # type: ignore[method-assign]
        sampler = runner.sampler
        sampler.sample = self._timed(sampler.sample, self.sample)  # type: ignore[method-assign]

    @staticmethod
    def _timed(method: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            result = method(*args)
            into.append(time.perf_counter() - start)
            return result

        return timed


def decode_run(engine: llmengine.Engine, clock: SplitClock, tokens: int) -> dict[str, float]:
    """One stream of `tokens` tokens; medians over its decode steps (the prefill left out)."""
    engine.add_request(PROMPT, llmengine.SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.step()
    clock.forward.clear()
    clock.sample.clear()
    steps = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    step, forward = statistics.median(steps), statistics.median(clock.forward)
    sample = statistics.median(clock.sample)
    return {"step": step, "forward": forward, "sample": sample, "rest": step - forward - sample}


def operator_counts(engine: llmengine.Engine, steps: int) -> Counter[str]:
    """Top-level ATen operators per decode step, from a profile of `steps` steps."""
    engine.add_request(PROMPT, llmengine.SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    engine.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        while engine.has_unfinished():
            engine.step()
    counts: Counter[str] = Counter()
    for event in profile.events():
        parent = event.cpu_parent
        if event.name.startswith("aten::") and not (parent and parent.name.startswith("aten::")):
            counts[event.name] += 1
    return Counter({name: count / steps for name, count in counts.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = llmengine.load_model()
    start = time.perf_counter()
    engines = {
        "eager": llmengine.Engine(model, num_blocks=64, num_slots=1),
        "decode graph": llmengine.Engine(model, num_blocks=64, num_slots=1, decode_graph=(1,)),
    }
    compile_s = time.perf_counter() - start
    clocks = {name: SplitClock(engine) for name, engine in engines.items()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for name, engine in engines.items():  # warm: caches, allocators, measured kernels
        decode_run(engine, clocks[name], 8)
    for _ in range(args.rounds):
        for name, engine in engines.items():
            runs[name].append(decode_run(engine, clocks[name], args.tokens))
    counts = {name: operator_counts(engine, args.profile_steps) for name, engine in engines.items()}
    eager_step = statistics.median(run["step"] for run in runs["eager"])
    rows = []
    for name in engines:
        part = {key: statistics.median(run[key] for run in runs[name]) for key in runs[name][0]}
        rows.append(
            [name, part["step"] * 1e3, part["forward"] * 1e3, part["sample"] * 1e3,
             part["rest"] * 1e3, part["rest"] / part["step"], sum(counts[name].values()),
             part["step"] / eager_step]
        )  # fmt: skip
    top = counts["eager"].most_common(12)
    text = "\n".join([
        "# Where one stream's decode step goes\n",
        f"The embedded model ({model.config.num_hidden_layers} layers, hidden size "
        f"{model.config.hidden_size}), one greedy stream of {args.tokens} tokens after an "
        f"{len(PROMPT)}-token prompt, {args.threads} thread(s); medians of {args.rounds} "
        f"rounds, the engines in turn. The decode graph's bucket compiled in {compile_s:.0f} s "
        "before anything was timed (both engines' construction).\n",
        markdown_table(rows, ["engine", "step ms", "forward ms", "sampling ms", "rest ms",
                              "rest / step", "ATen ops / step", "step / eager step"],
                       ["", ".3f", ".3f", ".3f", ".3f", ".1%", ".0f", ".2f"]),
        "The eager step's most frequent top-level operators (per step, from a profile of "
        f"{args.profile_steps} steps):\n",
        markdown_table([[name, count] for name, count in top], ["operator", "per step"],
                       ["", ".0f"]),
        "## Machine\n",
        markdown_table(machine_description(), ["", ""]),
    ])  # fmt: skip
    print(f"wrote {write_report('host-time', text, wallclock=True)}")


if __name__ == "__main__":
    main()

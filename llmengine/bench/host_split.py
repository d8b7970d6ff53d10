"""Where one stream's decode step goes: the forward against each piece of the host's work.

`StageClock` wraps the methods an engine's step calls in turn (the speculator's proposal, the
scheduler's decision, the runner's input preparation, the forward itself, the sampler and the
scheduler's update) on one engine's own objects, never their classes, and records each call's
seconds; what the step spends outside them (taking requests up, building the outcome) is the
rest. `stream_split` runs one stream to completion and keeps the medians over its decode
steps: what an overlap of host work and forward could at most hide is the step less its
forward. The engine's step runs as it always does, so the tokens are the same with the clock
as without.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from llmengine.engine import Engine
from llmengine.sampling import SamplingParams

# The stages in the order a step calls them: (name, owner's attribute path, method).
STAGES = (
    ("propose", "speculator", "propose"),
    ("schedule", "scheduler", "schedule"),
    ("prepare", "runner.preparer", "prepare"),
    ("forward", "runner", "execute"),
    ("sample", "runner.sampler", "sample"),
    ("update", "scheduler", "update"),
)
HOST_STAGES = tuple(name for name, _, _ in STAGES if name != "forward") + ("rest",)


def time_calls(owner: Any, method: str, record: Callable[[float, float], None]) -> None:
    """Wrap `owner`'s `method` on the instance, never its class, so that each call that
    returns hands its start and end (`time.perf_counter`) to `record`."""
    real = getattr(owner, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = real(*args, **kwargs)
        record(start, time.perf_counter())
        return result

    setattr(owner, method, timed)


class StageClock:
    """Seconds per call of each stage of `engine`'s step (its instances' methods wrapped);
    the forward's clock waits for the device when there is one, so it is the forward's."""

    def __init__(self, engine: Engine) -> None:
        self.seconds: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
        for name, path, method in STAGES:
            owner: Any = engine
            for attribute in path.split("."):
                owner = getattr(owner, attribute)
            into = self.seconds[name]
            time_calls(owner, method, lambda start, end, into=into: into.append(end - start))

    def clear(self) -> None:
        for seconds in self.seconds.values():
            seconds.clear()


def stream_split(
    engine: Engine, clock: StageClock, prompt: Sequence[int], tokens: int
) -> dict[str, float]:
    """One greedy stream of `tokens` tokens after `prompt` through `engine` (idle before);
    the medians over its decode steps (the prefill left out) of the step, each stage, the
    rest and the host's share (the step less its forward), in seconds, and its tokens/s.
    The rest and the host's share are taken step by step before their medians: on a shared
    machine a step's forward is sometimes twice another's, and a difference of medians
    taken apart would mix steps of either kind."""
    engine.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.step()  # the prefill, which is not a decode step
    clock.clear()
    steps: list[float] = []
    started = time.perf_counter()
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    elapsed = time.perf_counter() - started
    per_step = {name: seconds for name, seconds in clock.seconds.items() if seconds}
    # Each stage runs once per step of one plain stream; strict zips refuse anything else.
    staged = [sum(stage) for stage in zip(*per_step.values(), strict=True)]
    per_step["step"] = steps
    per_step["rest"] = [step - inside for step, inside in zip(steps, staged, strict=True)]
    per_step["host"] = [s - f for s, f in zip(steps, per_step["forward"], strict=True)]
    split = {name: statistics.median(seconds) for name, seconds in per_step.items()}
    split["tokens_per_s"] = len(steps) / elapsed
    return split


def median_split(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each key's median over several runs of `stream_split`."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}

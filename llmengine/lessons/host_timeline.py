"""Lesson 31's measurements of the host's share of a decode step, and its timeline figure.

`operator_cost_us` times one dispatch of a tiny operator, what every operator of an eager step
pays before any arithmetic. `call_costs` times one decode row of the embedded model three
ways on one cache: the eager forward, the compiled graph called through dynamo, and the same
compiled function called directly (`DecodeGraphs`, which the engine's step uses).
`record_timeline` runs an engine and keeps, step by step, when its own thread was in the
forward and when it was not, and, with the overlap, when the worker thread built the next
step's inputs; `plot_timeline` draws those intervals as lanes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from matplotlib.figure import Figure

from llmengine.bench.host_split import time_calls
from llmengine.engine import Engine
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams
from llmengine.runner.attention import PagedRow
from llmengine.runner.flex_inputs import DecodeInputBuffers
from llmengine.runner.forward import paged_forward
from llmengine.runner.graphs import DecodeGraphs

QUICK_OPTIONS: dict[str, object] = {"freezing": True}  # a compile of seconds, not a minute


def best_us(call: Callable[[], object], repeats: int = 200, rounds: int = 5) -> float:
    """The fastest round's median of `repeats` calls, in microseconds."""
    call()
    rounds_us = []
    for _ in range(rounds):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        rounds_us.append(sorted(times)[len(times) // 2] * 1e6)
    return min(rounds_us)


def operator_cost_us() -> float:
    """One `torch.add` of two one-element tensors: dispatch and little else."""
    a, b = torch.ones(1), torch.ones(1)
    return best_us(lambda: torch.add(a, b), repeats=2000)


def call_costs(model: Llama, context: int = 64, blocks: int = 16) -> dict[str, float]:
    """Microseconds for one decode row at `context` cached positions: the eager forward, the
    graph through dynamo (inputs in tensors of the caller's), the graph called directly
    (inputs in the graph's own buffers). The graph is compiled here with `QUICK_OPTIONS`."""
    config = model.config
    cache = PagedKVCache(config, blocks + 1, 16, dtype=torch.float32, device=torch.device("cpu"))
    graphs = DecodeGraphs(model, cache, blocks, [1], options=QUICK_OPTIONS)
    row = PagedRow([5], context, list(range(context // 16 + 1)))
    elsewhere = DecodeInputBuffers(1, cache.num_blocks, cache.block_size, blocks).fill([row])
    own = graphs.inputs_for([row], 1)
    with torch.inference_mode():
        return {
            "eager forward": best_us(lambda: paged_forward(model, cache, [row])),
            "graph, through dynamo": best_us(lambda: graphs([row], 1, elsewhere)),
            "graph, called directly": best_us(lambda: graphs([row], 1, own)),
        }


@dataclass
class Timeline:
    """Intervals in milliseconds from the first step's start, by lane."""

    lanes: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, lane: str, start: float, end: float) -> None:
        self.lanes.setdefault(lane, []).append((start, end))


def record_timeline(engine: Engine, prompt: list[int], steps: int) -> Timeline:
    """Run one greedy stream for `steps` decode steps after its prefill, recording each step's
    forward and host work on the engine's thread and, with the overlap, each guess the
    worker built (the engine's objects are wrapped, never their classes)."""
    timeline, origin = Timeline(), 0.0  # origin: set when the first timed step starts

    def timed(owner: Any, method: str, lane: str) -> None:
        def record(start: float, end: float) -> None:
            timeline.add(lane, (start - origin) * 1e3, (end - origin) * 1e3)

        time_calls(owner, method, record)

    engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    engine.step()  # the prefill
    timed(engine.runner, "execute", "forward")
    timed(engine, "step", "step")
    if engine.runner.overlap is not None:
        timed(engine.runner.overlap, "_build", "worker: next step's inputs")
    origin = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    recorded = timeline.lanes
    ordered = Timeline()
    # The host's part of each step: the step's time outside its forward, before and after.
    for (step_start, step_end), (forward_start, forward_end) in zip(
        recorded["step"], recorded["forward"], strict=True
    ):
        ordered.add("host", step_start, forward_start)
        ordered.add("host", forward_end, step_end)
    ordered.lanes["forward"] = recorded["forward"]
    for lane in set(recorded) - {"step", "forward"}:
        ordered.lanes[lane] = recorded[lane]
    return ordered


def plot_timeline(timeline: Timeline, title: str) -> Figure:
    """One lane per kind of interval, the engine's thread above the worker's."""
    fig = Figure(figsize=(8, 0.9 + 0.5 * len(timeline.lanes)), layout="constrained")
    ax = fig.add_subplot()
    colours = {"host": "tab:orange", "forward": "tab:blue"}
    for position, (lane, intervals) in enumerate(reversed(list(timeline.lanes.items()))):
        bars = [(start, end - start) for start, end in intervals]
        ax.broken_barh(bars, (position - 0.35, 0.7), color=colours.get(lane, "tab:green"))
    ax.set_yticks(range(len(timeline.lanes)), list(reversed(timeline.lanes)))
    ax.set_xlabel("milliseconds")
    ax.set_title(title)
    return fig

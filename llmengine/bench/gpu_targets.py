"""The GPU targets, each a measured value set against its goal from one benchmark's runs.

Decode targets take llmengine's better run at that batch (eager, or the decode graph where it
built) and say which; speed-ups are whole runs, llmengine's better over transformers'
compiled `generate` on the same burst. A target whose runs are missing (not run, skipped for
time, failed) is "not measured", never met.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmengine.bench.gpu_burst import BurstRun

EAGER = "llmengine eager"
GRAPH = "llmengine decode graph"
TRANSFORMERS = "transformers static+compile"


@dataclass(frozen=True, slots=True)
class Target:
    """`what` must reach `goal` (a lower bound); `measure` reads it off one batch's runs."""

    what: str
    batch: int
    goal: float
    shown: str  # format spec of the value and the goal
    measure: Callable[[list[BurstRun], float | None], tuple[float, str] | None]


def _best(runs: list[BurstRun], key: Callable[[BurstRun], float | None]) -> BurstRun | None:
    ours = [run for run in runs if run.engine.startswith("llmengine") and key(run) is not None]
    return max(ours, key=key, default=None)  # type: ignore[arg-type, return-value]


def _bound_share(runs: list[BurstRun], bound_gbs: float | None) -> tuple[float, str] | None:
    best = _best(runs, lambda run: run.bandwidth_gbs)
    if best is None or not bound_gbs or best.bandwidth_gbs is None:
        return None
    return best.bandwidth_gbs / bound_gbs, best.engine


def _decode_rate(runs: list[BurstRun], _bound: float | None) -> tuple[float, str] | None:
    best = _best(runs, lambda run: run.decode_tokens_per_s)
    if best is None or best.decode_tokens_per_s is None:
        return None
    return best.decode_tokens_per_s, best.engine


def _speedup(runs: list[BurstRun], _bound: float | None) -> tuple[float, str] | None:
    best = _best(runs, lambda run: run.whole_tokens_per_s)
    theirs = [run for run in runs if run.engine == TRANSFORMERS]
    if best is None or not theirs:
        return None
    return best.whole_tokens_per_s / theirs[0].whole_tokens_per_s, best.engine


TARGETS = (
    Target("decode, share of the bandwidth bound", 1, 0.5, ".1%", _bound_share),
    Target("decode tokens/s", 64, 25_000, ",.0f", _decode_rate),
    Target("decode tokens/s", 256, 50_000, ",.0f", _decode_rate),
    Target("whole run, times transformers' tokens/s", 1, 2.0, ".2f", _speedup),
    Target("whole run, times transformers' tokens/s", 64, 2.0, ".2f", _speedup),
)


def target_rows(runs: Sequence[BurstRun], bound_gbs: float | None) -> list[list[str]]:
    """One row per target: batch, what, goal, measured (and by which engine), met."""
    rows = []
    for target in TARGETS:
        at_batch = [run for run in runs if run.batch == target.batch]
        measured = target.measure(at_batch, bound_gbs)
        goal = f">= {target.goal:{target.shown}}"
        if measured is None:
            rows.append([str(target.batch), target.what, goal, "not measured", "no"])
            continue
        value, engine = measured
        met = "yes" if value >= target.goal else "no"
        rows.append(
            [str(target.batch), target.what, goal, f"{value:{target.shown}} ({engine})", met]
        )
    return rows


def graph_agreement(runs: Sequence[BurstRun]) -> list[list[str]]:
    """Per batch with a decode-graph run: whether its tokens equal the eager run's."""
    eager = {run.batch: run for run in runs if run.engine == EAGER}
    rows = []
    for run in runs:
        if run.engine == GRAPH and run.batch in eager:
            same = run.outputs == eager[run.batch].outputs
            rows.append([str(run.batch), "yes" if same else "no"])
    return rows

"""Reading a sweep run under preemption by swap: how much swap space it used, who was a victim.

Both answers come from the run's outcomes alone, the way batchbench reads a run, so a lesson
and a test can ask them of any `PoolResult` without looking inside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmengine.bench.batchbench import PoolResult
from llmengine.outcome import IterationOutcome


def swap_space_high_water(outcomes: Sequence[IterationOutcome]) -> int:
    """The most host blocks the run ever had booked at once.

    `held_swap_blocks` is counted once a step is decided, after its swap-ins gave their host
    blocks back; inside the decision, growth (which swaps victims out) runs before swap-in and
    never reuses those blocks, so the step's peak is that count plus the blocks it swapped in.
    A swap space of this many blocks runs the same schedule with no fallback to recompute.
    """
    return max((o.held_swap_blocks + o.blocks_swapped_in for o in outcomes), default=0)


def victim_latencies(result: PoolResult) -> tuple[list[int], list[int]]:
    """Latencies in iterations of the requests evicted at least once, and of the others.

    Both lists are in workload order. Evicted means by either mode: a swapped request left
    the batch as surely as a recomputed one did.
    """
    timing = result.timing
    victims, straight_through = [], []
    for request_id in result.run.request_ids:
        group = victims if request_id in timing.preempted_at else straight_through
        group.append(timing.latencies_iterations[request_id])
    return victims, straight_through


def wall_clock_reading(
    ms_per_iteration: Sequence[float], us_per_position: Sequence[float], at_12: dict[str, float]
) -> str:
    """What one timed sweep says, in sentences chosen by its numbers: which count the seconds
    follow more closely (the smaller max/min spread of seconds per unit), whether that is what
    the model's size predicts, and which mode's median run at 12 blocks is the shorter. A lesson
    that prints a fixed sentence beside wall-clock numbers is wrong whenever they turn round."""
    spreads = {
        "iterations": max(ms_per_iteration) / min(ms_per_iteration),
        "positions": max(us_per_position) / min(us_per_position),
    }
    closer, farther = sorted(spreads, key=spreads.__getitem__)
    if closer == "iterations":
        why = "That is what the model's size predicts (below)."
    else:
        why = (
            "The model's size predicts the opposite (below). A busy spell of a shared machine "
            "that falls on some runs and not others is enough to turn the comparison around."
        )
    shorter = "the shorter" if at_12["swap"] < at_12["recompute"] else "not the shorter"
    return (
        f"In this run, the milliseconds per iteration vary by a factor of "
        f"{spreads['iterations']:.2f} across the twelve runs, and the microseconds per position "
        f"by a factor of {spreads['positions']:.2f}: the run time follows the {closer} more "
        f"closely than the {farther}. {why} At 12 blocks the median recompute run takes "
        f"{at_12['recompute']:.3f} s and the swap run {at_12['swap']:.3f} s: here the swap run "
        f"is {shorter}."
    )

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

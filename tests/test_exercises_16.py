"""Lesson 16's exercise checks: each right answer, found here by a second route, is accepted,
a wrong one is not, and a blank one is unanswered.

The second route for the runs is a plain loop over the scheduler with a step cap, instead of
the lesson's driver and its repeated-state detector: a run that has not drained after many
more steps than its budgets have tokens is taken to loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises import lesson_16
from llmengine.lessons.victim_rules import RESTART_RULES, make_requests
from llmengine.scheduling.scheduler import Scheduler

CAP = 500


def finish_steps(
    rule: type[Scheduler],
    specs: Sequence[tuple[int, int]],
    num_blocks: int,
    block_size: int,
    one_per_step: bool = False,
) -> dict[int, int] | None:
    """Request id -> the step it finished in, or None when the run is still going at CAP."""
    scheduler = rule(num_blocks=num_blocks, block_size=block_size, num_slots=2)
    requests = make_requests(specs, block_size)
    finished: dict[int, int] = {}
    for step in range(CAP):
        arriving = requests[step : step + 1] if one_per_step else requests if step == 0 else []
        for request in arriving:
            scheduler.add(request)
        if not scheduler.has_unfinished() and (not one_per_step or step >= len(requests)):
            return finished
        out = scheduler.schedule()
        rows = {row.request.request_id: 7 for row in out.rows}
        for request in scheduler.update(out, rows):
            finished[request.request_id] = step + 1
    return None


def test_largest_budget_past_the_door() -> None:
    # A request writes prompt + budget - 1 positions: the largest budget whose writes fit.
    prompt, num_blocks, block_size = 5, 4, 3
    right = max(b for b in range(1, 40) if blocks_for_length(prompt + b - 1, 3) <= num_blocks)
    assert right == num_blocks * block_size - prompt + 1
    assert lesson_16.check_largest_budget_past_the_door(right).right is True
    assert lesson_16.check_largest_budget_past_the_door(right - 1).right is False
    assert lesson_16.check_largest_budget_past_the_door(None).right is None


def test_smallest_pool_that_stops_the_loop() -> None:
    largest = RESTART_RULES["largest"]
    door = max(blocks_for_length(p + b, 2) for p, b in lesson_16.WORKLOAD)
    right = next(
        pool
        for pool in range(door, 20)
        if finish_steps(largest, lesson_16.WORKLOAD, pool, 2) is not None
    )
    assert right > door  # the lesson's own pool loops
    assert lesson_16.check_smallest_pool_that_stops_the_loop(right).right is True
    assert lesson_16.check_smallest_pool_that_stops_the_loop(right - 1).right is False
    assert lesson_16.check_smallest_pool_that_stops_the_loop(None).right is None


def test_oldest_finishes_at() -> None:
    stream = [lesson_16.WORKLOAD[0]] + [lesson_16.WORKLOAD[1]] * 15
    finished = finish_steps(RESTART_RULES["youngest"], stream, 7, 2, one_per_step=True)
    assert finished is not None
    right = finished[0]
    assert lesson_16.check_oldest_finishes_at(right).right is True
    assert lesson_16.check_oldest_finishes_at(right + 1).right is False
    assert lesson_16.check_oldest_finishes_at(None).right is None

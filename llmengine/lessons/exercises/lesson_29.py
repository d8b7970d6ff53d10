"""Lesson 29's exercises: the lesson's burst on the iteration clock, where the answer does not
depend on when requests reach the server or how busy the machine is.

The checkers replay the burst (`llmengine.lessons.watching.lesson_burst`, every request
queued before the first step) through the engine's own `Scheduler` with no model: with
`ignore_eos` every request runs its whole budget, so the schedule does not depend on which
tokens are sampled, and a fixed token stands in for them (`replay_schedule`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from llmengine.bench.workloads import RequestSpec
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.watching import (
    BLOCK_SIZE,
    LIVE_POOL,
    LIVE_SLOTS,
    ROOMY_POOL,
    lesson_burst,
)
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler

STAND_IN_TOKEN = 7  # any id: the schedule of an ignore_eos burst never reads it


@dataclass(frozen=True, slots=True)
class Replay:
    """What the scheduler did with a workload: preemptions, the most blocks held in one
    step, and the steps it took."""

    preemptions: int
    peak_blocks: int
    steps: int


@functools.cache
def replay_schedule(
    workload: tuple[RequestSpec, ...],
    num_blocks: int,
    num_slots: int,
    enable_prefix_caching: bool = True,
) -> Replay:
    """Run `workload` (all queued before the first step) through a `Scheduler` alone."""
    scheduler = Scheduler(
        num_blocks=num_blocks, block_size=BLOCK_SIZE, num_slots=num_slots,
        enable_prefix_caching=enable_prefix_caching,
    )  # fmt: skip
    for request_id, spec in enumerate(workload):
        scheduler.add(
            Request(
                request_id=request_id,
                prompt_token_ids=list(spec.prompt_token_ids),
                params=spec.params,
                arrival=request_id,
                block_size=BLOCK_SIZE,
            )
        )
    preemptions = peak = steps = 0
    while scheduler.has_unfinished():
        decision = scheduler.schedule()
        preemptions += len(decision.preempted)
        peak = max(peak, decision.held_blocks)
        samples = {row.request.request_id: STAND_IN_TOKEN for row in decision.rows}
        scheduler.update(decision, samples)
        steps += 1
    return Replay(preemptions, peak, steps)


def most_calm_slots(num_blocks: int = LIVE_POOL, most: int = LIVE_SLOTS) -> int:
    """The most slots (up to `most`) at which the lesson's burst preempts nobody on
    `num_blocks` blocks; 0 if even one slot preempts."""
    burst = tuple(lesson_burst())
    calm = [s for s in range(1, most + 1) if replay_schedule(burst, num_blocks, s).preemptions == 0]
    return max(calm, default=0)


def check_calm_slots(answer: int | None) -> Verdict:
    """Exercise 1: the most slots at which the burst preempts nobody on the live pool."""
    return check_value(
        answer,
        None if answer is None else most_calm_slots(),
        what=f"the most slots (of {LIVE_SLOTS}) at which the burst preempts nobody on "
        f"{LIVE_POOL} blocks",
        explain="Each request ends holding 7 blocks, 2 of them the shared prefix's, which the "
        "cache counts once: s requests at once need 5s + 2 blocks, and 5s + 2 <= 24 stops at "
        "s = 4.",
    )


def roomy_peak() -> int:
    """The most blocks the burst holds in one step on a pool too large to preempt."""
    return replay_schedule(tuple(lesson_burst()), ROOMY_POOL, LIVE_SLOTS).peak_blocks


def check_roomy_peak(answer: int | None) -> Verdict:
    """Exercise 2: the peak of the pool over time when nothing is ever preempted."""
    return check_value(
        answer,
        None if answer is None else roomy_peak(),
        what=f"the most blocks held at once by the burst on {ROOMY_POOL} blocks, "
        f"{LIVE_SLOTS} slots",
        explain="Eight requests of 48 + 64 tokens each write 111 positions, 7 blocks of 16, "
        "and the first two blocks of every prompt are the same 32 tokens: 8 x 5 + 2.",
    )

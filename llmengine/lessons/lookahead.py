"""A one-step lookahead reserve, built so lesson 17 can watch it run dry.

The reserve is an admission rule: admit the head of the queue only if, once its blocks are
bought, the pool still holds one free block for every running row, the newcomer included.
That covers the next iteration, in which each decoding row buys at most one block. It covers
nothing after that: the rows spend the reserve as they cross block boundaries, and an
admission rule can only refuse newcomers, never hand a running row its block back. So the
next boundary crossing finds the pool dry and the engine preempts anyway. The core keeps its
plain watermark; this rule lives here, as a deliberately insufficient variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmengine.engine import Engine
from llmengine.sampling import SamplingParams
from llmengine.scheduling.scheduler import Scheduler


class LookaheadScheduler(Scheduler):
    """A scheduler whose admission keeps one free block per running row (newcomer included).

    The request at the head of the queue is admitted only while
    `pool.num_free - blocks_needed_for(request) >= len(running) + 1`. Growth, preemption and
    the door check are the core's (an engine `watermark` still narrows the door; admission
    asks for the reserve instead): the one rule it replaces is `free_blocks_to_keep`.
    """

    def free_blocks_to_keep(self) -> int:
        """Free blocks admission must leave: one for each running row after it, itself too."""
        return len(self.running) + 1


class LookaheadEngine(Engine):
    """The real engine, admitting under the lookahead reserve."""

    scheduler_class = LookaheadScheduler


@dataclass(frozen=True, slots=True)
class ReserveStep:
    """The pool as one iteration found it, before its scheduling decision.

    `growth` is what the running rows must buy for this iteration's positions (one block per
    row that crosses a block boundary): the demand the reserve exists to cover.
    """

    iteration: int
    running: int
    free: int
    growth: int
    evicted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)

    @property
    def reserve_holds(self) -> bool:
        """One free block per running row: whatever this iteration's rows ask, growth fits."""
        return self.free >= self.running


@dataclass(slots=True)
class ReserveTrace:
    """A run recorded iteration by iteration, and the tokens each request generated."""

    steps: list[ReserveStep]
    outputs: list[list[int]]

    @property
    def first_eviction(self) -> ReserveStep | None:
        """The first iteration that preempted someone, or None."""
        return next((step for step in self.steps if step.evicted), None)

    @property
    def reserve_held(self) -> list[int]:
        """Iterations before the first eviction that began with rows running and the reserve
        intact: one free block for every running row."""
        first = self.first_eviction
        last = first.iteration if first is not None else len(self.steps) + 1
        return [
            step.iteration
            for step in self.steps
            if step.running and step.reserve_holds and step.iteration < last
        ]


def trace_reserve(
    engine: Engine, prompts: Sequence[Sequence[int]], params: SamplingParams
) -> ReserveTrace:
    """Run `prompts` to completion on `engine`, recording the pool before every iteration.

    All prompts arrive before the first forward. The trace reads the scheduler's running list
    and its allocation rule before each step, then the step's outcome for who was evicted and
    who was admitted; iterations are numbered from 1.
    """
    request_ids = [engine.add_request(prompt, params) for prompt in prompts]
    scheduler = engine.scheduler
    steps = []
    while engine.has_unfinished():
        running = len(scheduler.running)
        growth = sum(scheduler.blocks_needed_for(request) for request in scheduler.running)
        free = engine.num_free_blocks
        outcome = engine.step()
        steps.append(
            ReserveStep(
                iteration=outcome.iteration + 1,
                running=running,
                free=free,
                growth=growth,
                evicted=outcome.evicted,
                admitted=outcome.admitted,
            )
        )
    outputs = [engine.request(request_id).output_token_ids for request_id in request_ids]
    return ReserveTrace(steps, outputs)

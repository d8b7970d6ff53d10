"""Lesson 28's account of what speculation costs when its guesses fail, step by step.

A run's wall time differs between two runs of the same configuration, so a small difference
between a run with speculation and one without says little on its own. `time_steps` times
one run step by step instead: each step's wall time, whether its forward carried drafts, and
the time the proposer took before it. `speculation_cost` interleaves rounds of a run without
speculation and one with it, and sets the two costs speculation adds (the proposer's scan at
every step, the wider forward of each step that carries drafts) beside the difference between
the runs' medians and the spread between rounds of the same configuration.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llmengine.lessons.speculation import engine_for
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One run, step by step: each step's seconds, whether its forward carried drafts, and
    the seconds the proposer took over the whole run."""

    seconds: list[float]
    drafted: list[bool]
    proposing: float

    @property
    def total(self) -> float:
        return sum(self.seconds)


def time_steps(model: Llama, prompts: Sequence[Sequence[int]], max_tokens: int,
               k: int | None) -> StepTimes:  # fmt: skip
    """`generate_counted`'s run (greedy, `max_tokens` each), each `Engine.step` timed alone,
    with the proposer's share of each step (`Speculator.propose`) timed inside it."""
    engine = engine_for(model, prompts, max_tokens, k)
    propose = engine.speculator.propose
    proposing = 0.0

    def timed_propose(running: object) -> None:
        nonlocal proposing
        start = time.perf_counter()
        propose(running)  # type: ignore[arg-type]
        proposing += time.perf_counter() - start

    engine.speculator.propose = timed_propose  # type: ignore[method-assign]
    engine.add_requests(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    seconds, drafted = [], []
    while engine.has_unfinished():
        start = time.perf_counter()
        outcome = engine.step()
        seconds.append(time.perf_counter() - start)
        drafted.append(bool(outcome.drafts))
    return StepTimes(seconds, drafted, proposing)


@dataclass(frozen=True, slots=True)
class SpeculationCost:
    """Rounds of one configuration without speculation (`plain`) and one with (`guessing`),
    interleaved, and what the step times say of the difference (all in seconds)."""

    plain: list[StepTimes]
    guessing: list[StepTimes]

    @property
    def difference(self) -> float:
        """Median run with speculation minus median run without."""
        return statistics.median(r.total for r in self.guessing) - statistics.median(
            r.total for r in self.plain
        )

    @property
    def spread(self) -> float:
        """The widest gap between two rounds of one configuration (fastest to slowest)."""
        return max(
            max(r.total for r in runs) - min(r.total for r in runs)
            for runs in (self.plain, self.guessing)
        )

    @property
    def drafted_forwards(self) -> int:
        """Decode steps of one run with speculation whose forward carried drafts."""
        return sum(self.guessing[0].drafted)

    @property
    def drafted_extra(self) -> float:
        """How much longer a decode step with drafts takes than one without (medians over
        every round's decode steps with speculation on; the prefill step left out)."""
        steps = [
            (seconds, drafted)
            for run in self.guessing
            for seconds, drafted in zip(run.seconds[1:], run.drafted[1:], strict=True)
        ]
        with_drafts = [seconds for seconds, drafted in steps if drafted]
        without = [seconds for seconds, drafted in steps if not drafted]
        if not with_drafts:
            return 0.0
        return statistics.median(with_drafts) - statistics.median(without)

    @property
    def proposing(self) -> float:
        """The proposer's seconds over one run (median over rounds)."""
        return statistics.median(r.proposing for r in self.guessing)

    @property
    def counted(self) -> float:
        """What speculation adds to a run by the step times: the proposer's scans and the
        drafted forwards' extra time."""
        return self.proposing + self.drafted_forwards * self.drafted_extra


def speculation_cost(model: Llama, prompts: Sequence[Sequence[int]], max_tokens: int, k: int,
                     rounds: int) -> SpeculationCost:  # fmt: skip
    """`rounds` rounds of `time_steps` without speculation and at `k`, interleaved, after one
    untimed run of each."""
    time_steps(model, prompts, max_tokens, None)
    time_steps(model, prompts, max_tokens, k)
    plain, guessing = [], []
    for _ in range(rounds):
        plain.append(time_steps(model, prompts, max_tokens, None))
        guessing.append(time_steps(model, prompts, max_tokens, k))
    return SpeculationCost(plain, guessing)

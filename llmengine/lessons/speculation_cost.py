"""Lesson 28's wall clock: what speculation buys and costs, run by run and step by step.

`time_runs` times `generate_counted`'s runs with the configurations interleaved round by
round, and `speed_rows` reduces them to one row per batch size and k, which
`scripts/bench_speculative.py` writes too.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmengine.lessons.speculation import Run, engine_for, generate_counted
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams


def time_runs(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    batches: Sequence[int],
    ks: Sequence[int | None],
    max_tokens: int,
    rounds: int,
    proposer: str = "ngram",
) -> dict[tuple[int, int | None], list[Run]]:
    """`generate_counted` for the first `batch` prompts at each k (None: no speculation) with
    `proposer` (prompt lookup, or a draft model's folder), `rounds` times each, the
    configurations interleaved within every round so that a slow spell of the machine hits
    them all; one untimed run of each comes first (a warm-up that also lets measured kernels
    time every row count the timed runs meet)."""
    configurations = [(batch, k) for batch in batches for k in ks]
    for batch, k in configurations:
        generate_counted(model, prompts[:batch], max_tokens, k, proposer)
    timed: dict[tuple[int, int | None], list[Run]] = {key: [] for key in configurations}
    for _ in range(rounds):
        for batch, k in configurations:
            run = generate_counted(model, prompts[:batch], max_tokens, k, proposer)
            timed[batch, k].append(run)
    return timed


@dataclass(frozen=True, slots=True)
class Speed:
    """One batch size and k, timed: the median of the rounds, set against no speculation.

    `forward_cost` is the median time of one forward over that of a forward without
    speculation at the same batch size: what checking the drafts adds to each forward."""

    batch: int
    k: int | None
    forwards: int
    tokens: int
    acceptance: float
    tokens_per_s: float
    forward_ms: float
    forward_cost: float
    speedup: float

    def row(self) -> list[object]:
        return [self.batch, "none" if self.k is None else self.k, self.forwards,
                self.tokens / self.forwards, self.acceptance, self.tokens_per_s,
                self.forward_ms, self.forward_cost, self.speedup]  # fmt: skip


SPEED_HEADERS = ("batch", "k", "forwards", "tokens per forward", "drafts kept", "tokens/s",
                 "ms per forward", "forward / forward without", "speed-up")  # fmt: skip
SPEED_FORMATS = ("d", "", "d", ".2f", ".1%", ",.0f", ".2f", ".2f", ".2f")


def speed_rows(timed: Mapping[tuple[int, int | None], list[Run]]) -> list[Speed]:
    """One `Speed` per configuration of `time_runs` (which must include k=None for each
    batch size), in its order."""
    speeds = []
    for (batch, k), runs in timed.items():
        base = timed[batch, None]
        seconds = statistics.median(run.seconds for run in runs)
        base_seconds = statistics.median(run.seconds for run in base)
        forward_ms = 1e3 * seconds / runs[0].forwards
        base_forward_ms = 1e3 * base_seconds / base[0].forwards
        speeds.append(
            Speed(
                batch,
                k,
                runs[0].forwards,
                runs[0].tokens,
                runs[0].acceptance,
                runs[0].tokens / seconds,
                forward_ms,
                forward_ms / base_forward_ms,
                base_seconds / seconds,
            )  # fmt: skip
        )
    return speeds


def faster_or_slower(speedup: float) -> str:
    """`speedup` (time without / time with) as a comparison that a reference completes:
    "1.40x faster than", "1.25x slower than", or "as fast as" within half a percent."""
    if abs(speedup - 1) < 0.005:
        return "as fast as"
    return f"{speedup:.2f}x faster than" if speedup > 1 else f"{1 / speedup:.2f}x slower than"


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

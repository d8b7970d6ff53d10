"""Clocks for batchbench: what "now" means while a workload runs.

The runner asks a clock three things: the time now, that one forward just happened (`tick`),
and to move on to a future arrival when the engine has nothing to do (`wait_until`). Which
clock answers decides the unit of every time in a `ContinuousTiming`:

- `IterationClock`: one unit per forward, so tables come out the same on every machine;
- `WallClock`: seconds of `time.perf_counter`, for real runs;
- `ScriptedClock`: each forward takes the next scripted duration, for tests of the seconds
  arithmetic without a stopwatch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    def start(self) -> None:
        """Begin a run at time 0."""

    def now(self) -> float:
        """Time since `start`."""

    def tick(self) -> None:
        """One forward has just finished."""

    def wait_until(self, moment: float) -> None:
        """Let time pass up to `moment` (the engine is idle until the next arrival)."""


@dataclass(slots=True)
class IterationClock:
    """Time is the number of forwards run, plus idle iterations skipped to reach an arrival."""

    elapsed: float = 0.0

    def start(self) -> None:
        self.elapsed = 0.0

    def now(self) -> float:
        return self.elapsed

    def tick(self) -> None:
        self.elapsed += 1.0

    def wait_until(self, moment: float) -> None:
        self.elapsed = max(self.elapsed, moment)


@dataclass(slots=True)
class WallClock:
    """Seconds since `start`, from `time.perf_counter`; waiting for an arrival really sleeps."""

    origin: float = field(default_factory=time.perf_counter)

    def start(self) -> None:
        self.origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def tick(self) -> None:
        """Wall time passes by itself."""

    def wait_until(self, moment: float) -> None:
        time.sleep(max(0.0, moment - self.now()))


@dataclass(slots=True)
class ScriptedClock:
    """The i-th forward takes `durations[i]` seconds; running out of script is an error."""

    durations: Sequence[float]
    elapsed: float = 0.0
    forwards: int = 0

    def start(self) -> None:
        self.elapsed = 0.0
        self.forwards = 0

    def now(self) -> float:
        return self.elapsed

    def tick(self) -> None:
        if self.forwards >= len(self.durations):
            raise RuntimeError(f"the script has {len(self.durations)} forwards, this is one more")
        self.elapsed += self.durations[self.forwards]
        self.forwards += 1

    def wait_until(self, moment: float) -> None:
        self.elapsed = max(self.elapsed, moment)

"""batchbench: feed a workload to an engine, record every step, and compare pool sizes.

`run_workload` adds each request when its arrival comes due, steps the engine until nothing
is left, and records each `IterationOutcome` with the clock's time. Everything it reports is
read from those outcomes (the generated tokens included), never from the engine's insides,
so `ContinuousTiming` is computed from exactly what a step told the world.

`sweep_pool_sizes` runs one workload through a fresh engine per pool size and refuses to
return timings if any pool generated different text: a surcharge measured on a run that
produced something else is the price of a bug, not of a small pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from statistics import fmean
from typing import TYPE_CHECKING, Any, Protocol

from llmengine.bench.clocks import Clock, IterationClock
from llmengine.bench.timing import Arrival, ContinuousTiming
from llmengine.bench.workloads import RequestSpec
from llmengine.outcome import IterationOutcome

if TYPE_CHECKING:
    from llmengine.engine import Engine
    from llmengine.model.llama import Llama
    from llmengine.sampling import SamplingParams


class SteppedEngine(Protocol):
    """What the runner needs from an engine: requests in, one step at a time, outcomes out."""

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int: ...

    def step(self) -> IterationOutcome: ...

    def has_unfinished(self) -> bool: ...


class DivergentOutputError(RuntimeError):
    """Two pools generated different tokens for the same workload: an engine bug."""


@dataclass(slots=True)
class WorkloadRun:
    """One workload through one engine: each step's outcome and the clock after it.

    `request_ids[i]` is the engine's id for the workload's i-th request and `outputs[i]` the
    tokens it generated, collected from the outcomes.
    """

    outcomes: list[IterationOutcome]
    times: list[float]
    arrivals: dict[int, Arrival]
    request_ids: list[int]
    outputs: list[list[int]]

    def timing(self) -> ContinuousTiming:
        return ContinuousTiming.from_outcomes(
            self.outcomes, times=self.times, arrivals=self.arrivals
        )


def run_workload(
    engine: SteppedEngine, workload: Sequence[RequestSpec], *, clock: Clock | None = None
) -> WorkloadRun:
    """Run `workload` to completion on `engine` (default clock: one unit per forward).

    Before every step, each request whose arrival has come is added; an idle engine waits
    for the next arrival. A request's arrival time is its spec's, not the moment the runner
    got round to adding it, so time spent waiting for a step boundary counts as latency.
    """
    clock = IterationClock() if clock is None else clock
    clock.start()
    due = deque(sorted(range(len(workload)), key=lambda index: workload[index].arrival))
    request_ids = [-1] * len(workload)
    run = WorkloadRun([], [], {}, request_ids, [])
    forwards = 0
    while due or engine.has_unfinished():
        if not engine.has_unfinished() and workload[due[0]].arrival > clock.now():
            clock.wait_until(workload[due[0]].arrival)
        while due and workload[due[0]].arrival <= clock.now():
            index = due.popleft()
            spec = workload[index]
            request_ids[index] = engine.add_request(list(spec.prompt_token_ids), spec.params)
            run.arrivals[request_ids[index]] = Arrival(iteration=forwards, time=spec.arrival)
        run.outcomes.append(engine.step())
        forwards += 1
        clock.tick()
        run.times.append(clock.now())
    generated: dict[int, list[int]] = {request_id: [] for request_id in request_ids}
    for outcome in run.outcomes:
        for request_id in outcome.tokens:
            generated[request_id].extend(outcome.new_tokens(request_id))
    run.outputs = [generated[request_id] for request_id in request_ids]
    return run


@dataclass(slots=True)
class PoolResult:
    """One pool size's run of the sweep: the recording, its timing, the tokens per request."""

    pool_blocks: int
    run: WorkloadRun
    timing: ContinuousTiming

    @property
    def outputs(self) -> list[list[int]]:
        """Generated tokens per request, in workload order."""
        return self.run.outputs

    @property
    def latencies_iterations(self) -> list[int]:
        """Each request's latency in iterations, in workload order."""
        return [self.timing.latencies_iterations[rid] for rid in self.run.request_ids]


def sweep_pool_sizes(
    model: Llama | Callable[..., Engine],
    workload: Sequence[RequestSpec],
    pools: Iterable[int],
    *,
    clock: Clock | None = None,
    progress: bool = False,
    **options: Any,
) -> list[PoolResult]:
    """The same workload through one fresh engine per pool size (in blocks), in `pools` order.

    Every engine gets the same `options`: the `EngineConfig` fields other than `num_blocks`
    (`block_size` and `num_slots` at least). `model` is the model each engine runs, or a
    function that builds an engine from those fields (`start_tensor_parallel` with its path
    and size bound, say); each engine is closed after its run. Raises `DivergentOutputError`
    when any pool's tokens differ from the first pool's, and ValueError (naming the pool) when
    a pool cannot take the workload at all.
    """
    from tqdm.auto import tqdm

    from llmengine.engine import Engine
    from llmengine.model.llama import Llama

    build = partial(Engine, model) if isinstance(model, Llama) else model
    results = []
    for pool_blocks in tqdm(list(pools), desc="pools", unit="pool", disable=not progress):
        with closing(build(num_blocks=pool_blocks, **options)) as engine:
            try:
                run = run_workload(engine, workload, clock=clock)
            except ValueError as error:
                raise ValueError(f"pool of {pool_blocks} blocks: {error}") from error
        results.append(PoolResult(pool_blocks, run, run.timing()))
    check_same_outputs(results)
    return results


def smallest_pool_running_all(results: Sequence[PoolResult]) -> int | None:
    """The smallest pool of a sweep over a burst in which nobody waited, or None.

    Nobody waited means every request was admitted into the first forward and none was ever
    evicted: the pool runs the whole burst at once. Which pool that is depends on what the
    admission policy books per request, which is why Week 8 and Day 33 give different answers.
    """
    for result in sorted(results, key=lambda result: result.pool_blocks):
        timing = result.timing
        if timing.prefill_rows[0] == timing.num_requests and not timing.preemptions:
            return result.pool_blocks
    return None


def victim_slowdown(result: PoolResult, baseline: PoolResult) -> float | None:
    """The requests preempted in `result`: their mean latency there over theirs in `baseline`.

    The clean counterpart of `preemption_latency_penalty`, whose control group is other
    requests of the same run: here each victim is compared with itself in a pool where nobody
    was preempted, so whatever else the small pool did to everybody is not mistaken for the
    absence of a cost. 1.0 when nothing was preempted; None when the baseline latencies are
    zero. ValueError when the two runs are not of one workload or the baseline preempted.
    """
    if len(result.run.request_ids) != len(baseline.run.request_ids):
        raise ValueError(
            f"{len(result.run.request_ids)} requests against {len(baseline.run.request_ids)}: "
            "not the same workload"
        )
    if baseline.timing.preemptions:
        raise ValueError(f"the baseline pool of {baseline.pool_blocks} blocks preempted too")
    victims = [
        index
        for index, request_id in enumerate(result.run.request_ids)
        if request_id in result.timing.preempted_at
    ]
    if not victims:
        return 1.0
    before = fmean(baseline.timing.latencies_s[baseline.run.request_ids[i]] for i in victims)
    if not before:
        return None
    return fmean(result.timing.latencies_s[result.run.request_ids[i]] for i in victims) / before


def check_same_outputs(results: Sequence[PoolResult]) -> None:
    """Raise `DivergentOutputError` at the first request whose tokens differ from pool one's."""
    if not results:
        return
    reference = results[0]
    for result in results[1:]:
        for index, (expected, got) in enumerate(
            zip(reference.outputs, result.outputs, strict=True)
        ):
            if expected != got:
                raise DivergentOutputError(
                    f"request {index} generated different tokens with {result.pool_blocks} "
                    f"blocks than with {reference.pool_blocks}: {got} vs {expected}"
                )

"""The admission watermark, swept: one workload through one engine per pool and watermark.

A watermark of W blocks admits a waiting request only if the pool keeps W blocks free after
buying the request's blocks, and the door check subtracts W from the pool a request's worst
case must fit. Lesson 17 runs a workload at several watermarks per pool, vLLM's rule among
them (`vllm_watermark_blocks`), and sets each one against watermark 0 on the same pools
(`judge_against_zero`). Every run must generate the same text; a pool whose door refuses the
workload under some watermark is kept as a refusal, with the door's reason, not as a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from statistics import fmean
from typing import TYPE_CHECKING

from llmengine.bench.batchbench import DivergentOutputError, WorkloadRun, run_workload
from llmengine.bench.timing import ContinuousTiming, percentile
from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine

if TYPE_CHECKING:
    from llmengine.model.llama import Llama

VLLM_WATERMARK = 0.01
LATENCY_GROUPS = ("victims", "straight through", "all")

# A rule is a fixed number of blocks or a function of the pool size (vLLM's fraction).
WatermarkRule = int | Callable[[int], int]
# One run of the sweep: the recording and its timing, or the reason it was refused.
_Outcome = tuple[WorkloadRun | None, ContinuousTiming | None, str | None]


def vllm_watermark_blocks(num_blocks: int, fraction: float = VLLM_WATERMARK) -> int:
    """vLLM v0's watermark in blocks: `int(fraction * num_blocks)`, so rounded down.

    The rule of `SelfAttnBlockSpaceManager.__init__` (vLLM 0.6.3.post1,
    vllm/core/block_manager.py, lines 65 and 91), whose scheduler never overrides the
    default fraction of 0.01. Below 100 blocks it is 0.
    """
    return int(fraction * num_blocks)


@dataclass(slots=True)
class WatermarkRun:
    """One (pool, rule) cell of a sweep: its run and timing, or the door's refusal.

    `watermark` is the number of blocks the rule came to for this pool.
    """

    pool_blocks: int
    rule: str
    watermark: int
    run: WorkloadRun | None = None
    timing: ContinuousTiming | None = None
    refusal: str | None = None

    @property
    def latencies(self) -> dict[str, list[int]]:
        """Latencies in iterations, in workload order: victims, straight through, and all.

        A victim is a request preempted at least once; the others ran straight through.
        """
        if self.run is None or self.timing is None:
            raise ValueError(f"rule {self.rule} at {self.pool_blocks} blocks was refused")
        groups: dict[str, list[int]] = {group: [] for group in LATENCY_GROUPS}
        for request_id in self.run.request_ids:
            latency = self.timing.latencies_iterations[request_id]
            victim = request_id in self.timing.preempted_at
            groups["victims" if victim else "straight through"].append(latency)
            groups["all"].append(latency)
        return groups

    def latency_percentile(self, group: str, q: float) -> float:
        """The q-th percentile of one group's latencies (iterations); NaN for an empty group."""
        values = self.latencies[group]
        return percentile(values, q) if values else math.nan


def sweep_watermarks(
    model: Llama,
    workload: Sequence[RequestSpec],
    pools: Iterable[int],
    rules: dict[str, WatermarkRule],
    *,
    block_size: int,
    num_slots: int,
    engine_class: type[Engine] = Engine,
) -> list[WatermarkRun]:
    """Run `workload` once per pool and watermark rule (iteration clock), rules in order.

    `engine_class` builds each engine (an Engine subclass with another admission rule runs
    the same sweep). Two rules that come to the same number of blocks on one pool share one
    run. Raises
    `DivergentOutputError` when any run generated other tokens than the first; a run the
    door refuses (or a watermark as large as the pool, which the engine refuses) is kept as
    a refusal.
    """
    cells = []
    runs: dict[tuple[int, int], _Outcome] = {}
    for pool_blocks in pools:
        for rule, blocks in rules.items():
            watermark = blocks(pool_blocks) if callable(blocks) else blocks
            key = (pool_blocks, watermark)
            if key not in runs:
                engine = partial(
                    engine_class,
                    model,
                    num_blocks=pool_blocks,
                    block_size=block_size,
                    num_slots=num_slots,
                    watermark=watermark,
                )
                runs[key] = _run_one(engine, workload)
            cells.append(WatermarkRun(pool_blocks, rule, watermark, *runs[key]))
    ran = [cell for cell in cells if cell.run is not None]
    for cell in ran[1:]:
        if cell.run.outputs != ran[0].run.outputs:
            raise DivergentOutputError(
                f"watermark {cell.watermark} at {cell.pool_blocks} blocks generated other "
                f"tokens than watermark {ran[0].watermark} at {ran[0].pool_blocks} blocks"
            )
    return cells


def _run_one(engine: Callable[[], Engine], workload: Sequence[RequestSpec]) -> _Outcome:
    """The run, its timing and no refusal; or no run and the refusal's reason.

    Building the engine is inside the try: the engine refuses a watermark as large as the
    pool when it is built, and the door refuses a request when it is added.
    """
    try:
        run = run_workload(engine(), workload)
    except ValueError as error:
        return None, None, str(error)
    return run, run.timing(), None


@dataclass(frozen=True, slots=True)
class WatermarkVerdict:
    """One rule against watermark 0, summed over the pools whose door admitted it.

    Counts are totals over those pools, `*_at_zero` the same totals for watermark 0 on the
    same pools. `positions` counts every position the forwards computed: what a rule really
    saves when it recomputes less, since `recomputed` also counts the one position per resume
    that is computed there for the first time (lesson 14). `occupancy_change` and `p99_ratio`
    (latency of all requests) are means over those pools of the per-pool difference and ratio.
    """

    rule: str
    pools_run: int
    pools_refused: int
    preemptions: int
    preemptions_at_zero: int
    recomputed: int
    recomputed_at_zero: int
    positions: int
    positions_at_zero: int
    iterations: int
    iterations_at_zero: int
    occupancy_change: float
    p99_ratio: float

    @property
    def break_even(self) -> float | None:
        """Extra iterations per forward position saved, when it buys positions with time.

        If a forward costs a fixed part plus a part per position, the rule saves time only
        when one position costs more than this many forwards' fixed part. None when the rule
        does not trade that way (it saves no positions, or costs no iterations).
        """
        saved = self.positions_at_zero - self.positions
        extra = self.iterations - self.iterations_at_zero
        if saved <= 0 or extra <= 0:
            return None
        return extra / saved

    @property
    def earns_the_default(self) -> bool:
        """Whether it beats 0 where a caller feels it: throughput or the tail, losing neither.

        It must serve every pool 0 serves, finish in no more iterations, leave the p99
        latency no longer, and improve at least one of the two.
        """
        fewer_iterations = self.iterations < self.iterations_at_zero
        shorter_tail = self.p99_ratio < 1.0
        no_worse = self.iterations <= self.iterations_at_zero and self.p99_ratio <= 1.0
        return not self.pools_refused and no_worse and (fewer_iterations or shorter_tail)


def judge_against_zero(
    cells: Sequence[WatermarkRun], zero_rule: str = "0"
) -> list[WatermarkVerdict]:
    """One verdict per rule other than `zero_rule`, in the order the sweep ran them."""
    zero = {cell.pool_blocks: cell for cell in cells if cell.rule == zero_rule}
    if any(cell.timing is None or cell.watermark for cell in zero.values()):
        raise ValueError(f"rule {zero_rule!r} must be watermark 0, run on every pool")
    verdicts = []
    for rule in dict.fromkeys(cell.rule for cell in cells if cell.rule != zero_rule):
        ran = [cell for cell in cells if cell.rule == rule and cell.timing is not None]
        refused = sum(cell.rule == rule and cell.timing is None for cell in cells)
        base = [zero[cell.pool_blocks] for cell in ran]
        verdicts.append(
            WatermarkVerdict(
                rule=rule,
                pools_run=len(ran),
                pools_refused=refused,
                preemptions=sum(cell.timing.preemptions for cell in ran),
                preemptions_at_zero=sum(cell.timing.preemptions for cell in base),
                recomputed=sum(cell.timing.total_recomputed_tokens for cell in ran),
                recomputed_at_zero=sum(cell.timing.total_recomputed_tokens for cell in base),
                positions=sum(cell.timing.total_forward_tokens for cell in ran),
                positions_at_zero=sum(cell.timing.total_forward_tokens for cell in base),
                iterations=sum(cell.timing.iterations for cell in ran),
                iterations_at_zero=sum(cell.timing.iterations for cell in base),
                occupancy_change=_mean(
                    [
                        cell.timing.occupancy - zero_cell.timing.occupancy
                        for cell, zero_cell in zip(ran, base, strict=True)
                    ]
                ),
                p99_ratio=_mean(
                    [
                        cell.latency_percentile("all", 99) / zero_cell.latency_percentile("all", 99)
                        for cell, zero_cell in zip(ran, base, strict=True)
                    ]
                ),
            )
        )
    return verdicts


def _mean(values: list[float]) -> float:
    """The mean, NaN for a rule that no pool admitted."""
    return fmean(values) if values else math.nan

"""batchbench without a model: timing arithmetic on scripted outcomes, clocks, the runner.

The outcomes here are written by hand, so every number asserted can be checked on paper;
the runner is driven by a fake engine that gives every live request one token per step.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

import pytest

from llmengine.bench.batchbench import (
    DivergentOutputError,
    PoolResult,
    WorkloadRun,
    check_same_outputs,
    run_workload,
    victim_slowdown,
)
from llmengine.bench.clocks import IterationClock, ScriptedClock, WallClock
from llmengine.bench.report import format_csv, format_table, sweep_summary
from llmengine.bench.timing import Arrival, ContinuousTiming, percentile
from llmengine.bench.workloads import (
    RequestSpec,
    mixed_workload,
    poisson_arrivals,
    staggered,
    uniform_burst,
    with_arrivals,
)
from llmengine.outcome import IterationOutcome, PoolShape
from llmengine.sampling import SamplingParams


def step(**fields: object) -> IterationOutcome:
    """An outcome of a 2-slot engine with block size 4; `rows` defaults to the tokens given."""
    fields.setdefault("pool", PoolShape(num_slots=2, block_size=4))
    fields.setdefault("rows", len(fields.get("tokens", {})))  # type: ignore[arg-type]
    return IterationOutcome(iteration=0, **fields)  # type: ignore[arg-type]


def one_victim_run() -> list[IterationOutcome]:
    """Two 3-token prompts with a budget of 3; request 1 is evicted in iteration 2."""
    return [
        step(tokens={0: 10, 1: 20}, admitted=[0, 1], prefill_rows=2, forward_tokens=6),
        step(tokens={0: 11}, evicted=[1], forward_tokens=1),
        step(tokens={0: 12}, finished=[0], forward_tokens=1),
        step(tokens={1: 21}, admitted=[1], prefill_rows=1, forward_tokens=4, recomputed_tokens=4),
        step(tokens={1: 22}, finished=[1], forward_tokens=1),
    ]


# -- ContinuousTiming: the arithmetic ------------------------------------------------------


def test_series_and_throughput() -> None:
    timing = ContinuousTiming.from_outcomes(one_victim_run())
    assert timing.rows == [2, 1, 1, 1, 1]
    assert timing.prefill_rows == [2, 0, 0, 1, 0]
    assert timing.forward_tokens == [6, 1, 1, 4, 1]
    assert timing.recomputed_tokens == [0, 0, 0, 4, 0]
    assert timing.iterations == 5 and timing.total_tokens == 6 and timing.num_requests == 2
    assert timing.occupancy == pytest.approx(6 / (5 * 2))
    assert timing.waste_fraction == 0.0


def test_preemption_bill() -> None:
    timing = ContinuousTiming.from_outcomes(one_victim_run())
    assert timing.preempted_at == {1: [2]}
    assert timing.preemptions == 1 and timing.preemptions_per_request == 0.5
    assert timing.total_forward_tokens == 13 and timing.total_recomputed_tokens == 4
    assert timing.recompute_fraction == pytest.approx(4 / 13)
    assert timing.tokens_per_eviction == 4.0


def test_latencies_in_iterations_by_default() -> None:
    timing = ContinuousTiming.from_outcomes(one_victim_run())
    assert timing.latencies_iterations == {0: 3, 1: 5}
    assert timing.latencies_s == {0: 3.0, 1: 5.0}
    assert timing.preempted_latencies_s == {1: 5.0}
    assert timing.straight_through_latencies_s == {0: 3.0}
    assert timing.preemption_latency_penalty == pytest.approx(5 / 3)
    assert timing.mean_latency_s == 4.0


def test_latencies_ttft_and_tpot_in_clock_time() -> None:
    times = [0.5, 1.0, 1.5, 3.5, 4.0]
    timing = ContinuousTiming.from_outcomes(one_victim_run(), times=times)
    assert timing.end_times_s == times
    assert timing.latencies_s == {0: 1.5, 1: 4.0}
    assert timing.latencies_iterations == {0: 3, 1: 5}
    assert timing.time_to_first_token_s == {0: 0.5, 1: 0.5}
    assert timing.time_per_output_token_s == {0: 0.5, 1: 1.75}
    assert timing.preemption_latency_penalty == pytest.approx(4.0 / 1.5)


def test_latency_counts_from_arrival() -> None:
    arrivals = {0: Arrival(iteration=0, time=0.0), 1: Arrival(iteration=1, time=0.75)}
    timing = ContinuousTiming.from_outcomes(
        one_victim_run(), times=[1.0, 2.0, 3.0, 4.0, 5.0], arrivals=arrivals
    )
    assert timing.latencies_iterations == {0: 3, 1: 4}
    assert timing.latencies_s == {0: 3.0, 1: 4.25}
    assert timing.time_to_first_token_s[1] == 0.25
    # Arriving between two forwards: the clock counts the fraction, iterations do not.
    assert (timing.mean_latency_s, timing.mean_latency_iterations) == (3.625, 3.5)


def test_percentiles() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert (percentile([4, 1, 3, 2], 0), percentile([4, 1, 3, 2], 100)) == (1, 4)
    assert percentile([10, 20], 90) == pytest.approx(19.0)
    assert percentile([7], 99) == 7
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1], 101)
    timing = ContinuousTiming.from_outcomes(one_victim_run())
    assert timing.latency_percentiles((0, 50, 100)) == {0: 3.0, 50: 4.0, 100: 5.0}


def two_kinds_of_victim_run() -> list[IterationOutcome]:
    """Three 3-token prompts, budget 3: r2 swapped out (2 blocks) in iteration 2, r1 evicted by
    recompute in iteration 3; r2 swaps back in iteration 4, r1 resumes in iteration 5."""
    common = {"pool": PoolShape(num_slots=2, block_size=4, bytes_per_block=100, num_swap_blocks=4)}
    return [
        step(tokens={0: 1, 1: 1, 2: 1}, admitted=[0, 1, 2], forward_tokens=9, **common),
        step(
            tokens={0: 2, 1: 2},
            evicted=[2],
            swapped_out=[2],
            blocks_swapped_out=2,
            forward_tokens=2,
            held_swap_blocks=2,
            **common,
        ),
        step(tokens={0: 3}, evicted=[1], finished=[0], held_swap_blocks=2, **common),
        step(tokens={2: 2}, swapped_in=[2], blocks_swapped_in=2, **common),
        step(
            tokens={1: 3, 2: 3},
            admitted=[1],
            resumed=[1],
            finished=[1, 2],
            forward_tokens=6,
            recomputed_tokens=5,
            **common,
        ),
    ]


def test_swap_bill() -> None:
    timing = ContinuousTiming.from_outcomes(two_kinds_of_victim_run())
    assert timing.preempted_at == {2: [2], 1: [3]} and timing.preemptions == 2
    assert timing.swapped_out_at == {2: [2]} and timing.swapped_in_at == {2: [4]}
    assert (timing.swap_outs, timing.swap_ins, timing.recompute_preemptions) == (1, 1, 1)
    assert timing.total_blocks_swapped_out == timing.total_blocks_swapped_in == 2
    assert timing.bytes_swapped == 4 * 100 and timing.num_swap_blocks == 4
    # The swapped victim recomputed nothing: its eviction does not dilute the recompute bill.
    assert timing.tokens_per_eviction == 5.0


def test_no_swap_space_means_no_swap_bill() -> None:
    timing = ContinuousTiming.from_outcomes(one_victim_run())
    assert (timing.swap_outs, timing.swap_ins, timing.bytes_swapped) == (0, 0, 0)
    assert timing.recompute_preemptions == timing.preemptions == 1


# -- ContinuousTiming: every guard value ----------------------------------------------------


def test_nothing_preempted_means_penalty_one_and_no_tokens_per_eviction() -> None:
    timing = ContinuousTiming.from_outcomes(
        [step(tokens={0: 1, 1: 2}, forward_tokens=4), step(tokens={0: 1, 1: 2}, finished=[0, 1])]
    )
    assert timing.preempted_at == {} and timing.preemptions == 0
    assert timing.preemption_latency_penalty == 1.0
    assert timing.tokens_per_eviction is None
    assert timing.recompute_fraction == 0.0


def test_nobody_straight_through_means_no_control_group_not_one() -> None:
    # A lone request that is its own victim: comparing it with itself would read 1.0.
    timing = ContinuousTiming.from_outcomes(
        [
            step(tokens={0: 1}, forward_tokens=5),
            step(evicted=[0]),
            step(tokens={0: 2}, finished=[0], forward_tokens=6, recomputed_tokens=6),
        ]
    )
    assert timing.straight_through_latencies_s == {}
    assert timing.preemption_latency_penalty is None


def test_a_control_group_that_took_no_time_is_no_baseline() -> None:
    timing = ContinuousTiming.from_outcomes(one_victim_run(), times=[0.0] * 5)
    assert timing.preemption_latency_penalty is None


def test_an_unreported_forward_tokens_is_one_position_per_row() -> None:
    timing = ContinuousTiming.from_outcomes([step(tokens={0: 1, 1: 2}, finished=[0, 1])])
    assert timing.forward_tokens == [2] and timing.recompute_fraction == 0.0


def test_waste_fraction_counts_rows_that_produced_nothing() -> None:
    # A static batch: both rows run until the longer request is done.
    timing = ContinuousTiming.from_outcomes(
        [
            step(tokens={0: 1, 1: 2}),
            step(tokens={1: 3}, rows=2, finished=[1]),
            step(tokens={}, rows=2),
            step(tokens={0: 4}, rows=2, finished=[0]),
        ]
    )
    assert timing.waste_fraction == pytest.approx(4 / 8)
    assert timing.occupancy == pytest.approx(4 / 8)


def test_pool_wastes() -> None:
    timing = ContinuousTiming.from_outcomes(
        [
            step(tokens={0: 1}, held_blocks=8, needed_blocks=2, kv_tokens=5),
            step(tokens={0: 2}, finished=[0], held_blocks=8, needed_blocks=2, kv_tokens=6),
        ]
    )
    assert timing.reservation_waste == pytest.approx(12 / 16)
    assert timing.fragmentation_waste == pytest.approx((16 - 11) / 16)
    bare = ContinuousTiming.from_outcomes([step(tokens={0: 1}, finished=[0])])
    assert (bare.reservation_waste, bare.fragmentation_waste) == (0.0, 0.0)


def test_every_outcome_is_one_iteration() -> None:
    timing = ContinuousTiming.from_outcomes(
        [
            step(tokens={0: 1, 1: 1}),
            step(tokens={0: 2}, evicted=[1]),
            step(tokens={0: 3}, finished=[0]),
            step(tokens={1: 2}, finished=[1], recomputed_tokens=2, forward_tokens=2),
        ]
    )
    assert timing.iterations == 4 and timing.rows == [2, 1, 1, 1]
    assert timing.preempted_at == {1: [2]}
    assert timing.latencies_iterations == {0: 3, 1: 4}
    assert timing.end_times_s == [1.0, 2.0, 3.0, 4.0]


def test_no_forward_and_mismatched_times_are_refused() -> None:
    with pytest.raises(ValueError, match="no forward"):
        ContinuousTiming.from_outcomes([])
    with pytest.raises(ValueError, match="5 outcomes but 2 times"):
        ContinuousTiming.from_outcomes(one_victim_run(), times=[1.0, 2.0])


# -- workloads -----------------------------------------------------------------------------


def test_uniform_burst_is_the_seeds_shape_and_deterministic() -> None:
    burst = uniform_burst(6, 5, 24, vocab_size=50, seed=1)
    assert len(burst) == 6
    assert all(len(spec.prompt_token_ids) == 5 and spec.arrival == 0.0 for spec in burst)
    assert all(0 <= token < 50 for spec in burst for token in spec.prompt_token_ids)
    params = burst[0].params
    assert (params.max_tokens, params.greedy, params.ignore_eos) == (24, True, True)
    assert burst == uniform_burst(6, 5, 24, vocab_size=50, seed=1)
    assert burst != uniform_burst(6, 5, 24, vocab_size=50, seed=2)


def test_mixed_workload_draws_inside_its_ranges() -> None:
    mixed = mixed_workload(40, prompt_lens=(2, 9), budgets=(1, 30), vocab_size=50, seed=3)
    lengths = {len(spec.prompt_token_ids) for spec in mixed}
    budgets = {spec.params.max_tokens for spec in mixed}
    assert min(lengths) >= 2 and max(lengths) <= 9 and len(lengths) > 1
    assert min(budgets) >= 1 and max(budgets) <= 30 and len(budgets) > 1
    assert mixed == mixed_workload(40, prompt_lens=(2, 9), budgets=(1, 30), vocab_size=50, seed=3)


def test_arrivals_over_time() -> None:
    burst = uniform_burst(4, 3, 2, vocab_size=50)
    assert [spec.arrival for spec in staggered(burst, 2.5)] == [0.0, 2.5, 5.0, 7.5]
    poisson = [spec.arrival for spec in poisson_arrivals(burst, rate=2.0, seed=0)]
    assert poisson[0] == 0.0 and poisson == sorted(poisson) and len(set(poisson)) == 4
    assert [s.prompt_token_ids for s in with_arrivals(burst, [3, 2, 1, 0])] == [
        s.prompt_token_ids for s in burst
    ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: uniform_burst(0, 5, 24, vocab_size=50),
        lambda: uniform_burst(2, 5, 0, vocab_size=50),
        lambda: mixed_workload(2, prompt_lens=(5, 2), budgets=(1, 2), vocab_size=50),
        lambda: mixed_workload(2, prompt_lens=(0, 2), budgets=(1, 2), vocab_size=50),
        lambda: with_arrivals(uniform_burst(2, 5, 3, vocab_size=50), [0.0]),
        lambda: poisson_arrivals(uniform_burst(2, 5, 3, vocab_size=50), rate=0.0),
        lambda: RequestSpec((), SamplingParams()),
        lambda: RequestSpec((1,), SamplingParams(), arrival=-1.0),
        lambda: RequestSpec((1,), SamplingParams(), arrival=math.nan),
    ],
)
def test_bad_workloads_are_refused(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


# -- clocks ----------------------------------------------------------------------------------


def test_iteration_clock() -> None:
    clock = IterationClock()
    clock.tick()
    clock.wait_until(4.5)
    clock.wait_until(1.0)
    clock.tick()
    assert clock.now() == 5.5
    clock.start()
    assert clock.now() == 0.0


def test_scripted_clock_runs_its_script_and_no_further() -> None:
    clock = ScriptedClock([0.25, 0.5])
    clock.tick()
    clock.wait_until(2.0)
    clock.tick()
    assert clock.now() == 2.5
    with pytest.raises(RuntimeError, match="2 forwards"):
        clock.tick()
    clock.start()
    assert (clock.now(), clock.forwards) == (0.0, 0)


def test_wall_clock_measures_and_waits() -> None:
    clock = WallClock()
    clock.start()
    clock.wait_until(0.01)
    assert 0.01 <= clock.now() < 1.0


# -- the runner, on a fake engine -------------------------------------------------------------


class EveryoneEveryStep:
    """A fake engine with unlimited slots: each live request gets one token per step."""

    def __init__(self) -> None:
        self.budgets: list[int] = []
        self.generated: list[int] = []

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        self.budgets.append(params.max_tokens)
        self.generated.append(0)
        return len(self.budgets) - 1

    def has_unfinished(self) -> bool:
        return any(g < b for g, b in zip(self.generated, self.budgets, strict=True))

    def step(self) -> IterationOutcome:
        live = [r for r, b in enumerate(self.budgets) if self.generated[r] < b]
        for r in live:
            self.generated[r] += 1
        return IterationOutcome(
            iteration=0,
            tokens={r: 100 * r + self.generated[r] for r in live},
            finished=[r for r in live if self.generated[r] == self.budgets[r]],
            rows=len(live),
            forward_tokens=len(live),
            pool=PoolShape(num_slots=4),
        )


def specs(*budgets: int) -> list[RequestSpec]:
    return [RequestSpec((1, 2), SamplingParams(max_tokens=b, ignore_eos=True)) for b in budgets]


def test_runner_waits_for_a_late_arrival_on_the_iteration_clock() -> None:
    run = run_workload(EveryoneEveryStep(), with_arrivals(specs(2, 2), [0, 5]))
    assert run.times == [1.0, 2.0, 6.0, 7.0]
    assert run.arrivals == {0: Arrival(0, 0.0), 1: Arrival(2, 5.0)}
    timing = run.timing()
    assert timing.iterations == 4
    assert timing.latencies_iterations == {0: 2, 1: 2}
    assert timing.latencies_s == {0: 2.0, 1: 2.0}


def test_runner_adds_a_request_at_the_first_step_boundary_after_it_arrives() -> None:
    run = run_workload(EveryoneEveryStep(), with_arrivals(specs(3, 1), [0, 0.5]))
    timing = run.timing()
    assert run.arrivals[1] == Arrival(iteration=1, time=0.5)
    assert timing.latencies_iterations[1] == 1
    assert timing.latencies_s[1] == 1.5  # the half iteration it waited for the boundary counts


def test_runner_reports_outputs_in_workload_order() -> None:
    # The first request arrives last, so the engine numbers it 1.
    run = run_workload(EveryoneEveryStep(), with_arrivals(specs(2, 3), [1, 0]))
    assert run.request_ids == [1, 0]
    assert run.outputs == [[101, 102], [1, 2, 3]]


def test_runner_with_a_scripted_clock() -> None:
    run = run_workload(EveryoneEveryStep(), specs(1, 3), clock=ScriptedClock([0.5, 0.1, 0.1]))
    timing = run.timing()
    assert run.times == pytest.approx([0.5, 0.6, 0.7])
    assert timing.latencies_s == pytest.approx({0: 0.5, 1: 0.7})
    assert timing.time_per_output_token_s == pytest.approx({1: 0.1})


# -- the report and the text check --------------------------------------------------------------


def pool_result(pool_blocks: int, *budgets: int) -> PoolResult:
    run = run_workload(EveryoneEveryStep(), specs(*budgets))
    return PoolResult(pool_blocks, run, run.timing())


def test_pools_that_generated_different_text_are_refused() -> None:
    same, other = pool_result(8, 2, 3), pool_result(4, 2, 3)
    check_same_outputs([same, other])
    other.run.outputs[1][2] = 999
    with pytest.raises(DivergentOutputError, match="request 1 .* 4 blocks than with 8"):
        check_same_outputs([same, other])


def test_summary_table_and_csv_agree() -> None:
    summaries = sweep_summary([pool_result(8, 2, 3), pool_result(4, 2, 3)])
    assert summaries[0]["latencies_iterations"] == [2, 3]
    assert summaries[0]["preemption_latency_penalty"] == 1.0
    assert summaries[0]["tokens_per_eviction"] is None
    assert all(summary["same_text"] for summary in summaries)
    table = format_table(summaries).splitlines()
    assert len({len(line) for line in table[:3]}) == 1  # header and rows are aligned
    assert table[1].split()[0] == "8" and "n/a" in table[1] and "1.00x" in table[1]
    assert table[-1] == "same text in every pool: yes"
    rows = list(csv.DictReader(io.StringIO(format_csv(summaries))))
    assert [row["pool_blocks"] for row in rows] == ["8", "4"]
    assert rows[0]["latencies_iterations"] == "2 3" and rows[0]["tokens_per_eviction"] == ""


def test_the_swap_columns_appear_only_with_a_swap_space() -> None:
    outcomes = two_kinds_of_victim_run()
    run = WorkloadRun(outcomes, [1.0, 2.0, 3.0, 4.0, 5.0], {}, [0, 1, 2], [[1, 2, 3]] * 3)
    swap = sweep_summary([PoolResult(6, run, run.timing())])[0]
    assert (swap["swap_blocks"], swap["swapped_out"], swap["swapped_in"]) == (4, 1, 1)
    assert (swap["recompute_preemptions"], swap["preemptions"]) == (1, 2)
    assert (swap["blocks_swapped_out"], swap["blocks_swapped_in"], swap["bytes_swapped"]) == (
        2,
        2,
        400,
    )
    recompute = sweep_summary([pool_result(8, 2, 3)])
    assert recompute[0]["swap_blocks"] == 0
    plain_header = format_table(recompute).splitlines()[0]
    swap_header = format_table([swap]).splitlines()[0]
    assert "swapped" not in plain_header and "MiB moved" not in plain_header
    assert swap_header.startswith(plain_header) and swap_header.split()[-2:] == ["MiB", "moved"]


def one_victim_result() -> PoolResult:
    outcomes = one_victim_run()
    times = [float(i) for i in range(1, len(outcomes) + 1)]
    run = WorkloadRun(outcomes, times, {0: Arrival(), 1: Arrival()}, [0, 1], [[10], [20]])
    return PoolResult(4, run, run.timing())


def test_victim_slowdown_compares_each_victim_with_itself() -> None:
    cramped, roomy = one_victim_result(), pool_result(8, 3, 3)
    # Request 1 finishes at 5 when evicted and at 3 in the roomy pool.
    assert victim_slowdown(cramped, roomy) == pytest.approx(5 / 3)
    assert victim_slowdown(roomy, roomy) == 1.0
    with pytest.raises(ValueError, match="preempted too"):
        victim_slowdown(roomy, cramped)
    with pytest.raises(ValueError, match="not the same workload"):
        victim_slowdown(cramped, pool_result(8, 3, 3, 3))
